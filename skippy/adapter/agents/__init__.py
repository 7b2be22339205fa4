"""The agent APIs: OpenAI Responses and Anthropic Messages, each translated onto the adapter's chat route.

A request of either API becomes the /v1/chat/completions body it means and runs through the chat route's own
parsing and pipeline (skippy.adapter.openai_request, skippy.adapter.completions); its events are rendered
back in that API's shapes, errors in its envelope.

- `translation.py`: what both translations share (`Translated`, field names mapped back in errors).
- `responses_request.py` (a Responses request -> its chat body) and `responses_api.py` (`POST /v1/responses`,
  `/v1/responses/input_tokens`, the Responses stream and objects).
- `anthropic_request.py` (a Messages request -> its chat body) and `anthropic_api.py` (`POST /v1/messages`,
  `/v1/messages/count_tokens`, Anthropic's events and error envelope).
"""
