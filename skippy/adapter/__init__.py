"""The adapter process: the OpenAI-compatible HTTP front door, over the broker (`skippy adapter`).

It turns HTTP requests into token ids for the broker (`skippy.client.PipelineClient`) and the token events
that come back into OpenAI, llama-server or Anthropic responses. The HTTP server under it is skippy.http,
which knows nothing of this package. Start at `routes.py`, the one route table.

- `adapter_main.py`: the process's main (its flags are read in skippy.cli.adapter): API key, /metrics, shutdown.
- `routes.py`: `OpenAIAdapter`, the route table: health and readiness, /v1/models, /metrics, /detokenize, and
  where every other route lives.
- `completions.py`: /v1/chat/completions, /v1/completions and /infill over the broker: template, tokenize,
  stream, stops, tool calls, usage, broker errors as HTTP.
- `context_errors.py`: a prompt over the context, as each API words it.
- `resume.py`: `ResumingClient`: a request lost with its stage 0 or the broker (`pipeline_lost`) is submitted
  anew from the tokens its client already has (a `ResumePoint`), once a pipeline is ready again.
- `openai_request.py` (the request body -> a validated `GenerationRequest`), `request_fields.py` (which
  fields are honoured, accepted or refused), `chat_messages.py` (chat `messages`), `openai_response.py`
  (completion objects, stream chunks, usage, logprobs): the OpenAI shapes.
- `sampling_defaults.py`: the model's own sampling for the fields a request leaves out.
- `chat_template.py` (the model's chat template, rendered by `jinja_template.py`, or llama.cpp's built-in one),
  `stops.py`, `tokenize.py` (/tokenize, /detokenize), `infill.py` (fill-in-the-middle): the text around the token ids.
- `prompt_routes.py` (/apply-template, input-token counts, /tokenize) and `pipeline_info.py` (/props,
  /slots): llama-server's smaller routes.
- `request_metrics.py` (requests, tokens, TTFT/TPOT, the broker's view), `prefix_metrics.py` (the prefix
  cache) and `spec_metrics.py` (llama-server's speculative counters): the adapter's /metrics.
- `dashboard.py`: the live pipeline page /dashboard and the JSON it polls (the page itself: the static
  folder beside it).
- `agents/`: the OpenAI Responses and Anthropic Messages APIs, translated onto the chat route.
- `grammar/`: response formats, JSON Schemas and tool calls as the grammar the final stage samples under.
"""
