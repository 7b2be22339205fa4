"""The OpenAI-compatible HTTP adapter and the small HTTP/1.1 server under it (asyncio streams + h11).

- `server`, `connection`, `framing`, `json_body`, `routing`, `errors`, `auth`, `cors`, `sse`, `busy`: the
  server library: connections with deadlines and a cap, request heads and bodies within limits, bounded
  JSON, the route table, OpenAI error envelopes, the API key, CORS, event streams, requests in progress.
- `adapter`: the routes; `generation`: /v1/chat/completions and /v1/completions over the broker
  (`skippy.client.PipelineClient`); `openai_request`, `request_fields`, `messages`, `openai_response`:
  the OpenAI shapes; `chat_template`, `stops`, `tokenize`: text around the token ids.
- `responses_api`, `responses_request` (OpenAI Responses) and `anthropic_api`, `anthropic_request` (Anthropic
  Messages): each request translated into the chat request it means and run by `generation`
  (`translation`: what both share), its events rendered back in that API's shapes.
- `structured`, `json_schema`, `schema_pattern`, `tools`, `tool_output`: response formats and tool calls
  as grammars for the final stage.
- `metrics`, `prefix_metrics`: the adapter's /metrics; `dashboard` (with `static/`): the live pipeline page.
"""
