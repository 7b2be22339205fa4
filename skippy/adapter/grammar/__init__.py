"""Structured output and tool calls: what a request asks of the output's form, as a GBNF grammar.

The grammar travels with the request to the final stage, whose sampler chain samples under it
(skippy.runtime.grammar_sampler); the output that comes back is read here again for tool calls.

- `structured.py`: `response_format` and tools -> the one grammar a request samples under (or none); start here.
- `json_schema.py`: a JSON Schema checked and normalised, then converted to GBNF that only valid output completes.
- `schema_pattern.py`: a schema's `pattern` -> a regex in the safe subset the converter keeps faithfully.
- `tools.py`: `tools` / `tool_choice` -> the system prompt that lists them and the call's grammar.
- `tool_output.py`: generated text -> content and OpenAI tool-call deltas, as the text arrives.
"""
