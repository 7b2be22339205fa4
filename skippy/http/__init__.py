"""A small HTTP/1.1 server library on asyncio streams + h11: what the adapter's routes are served with.

It knows routes, requests, responses and limits; nothing of models, pipelines or the adapter that serves
its routes with it. Start at `server.py`.

- `server.py`: `HttpServer`: listening, the connection cap, a graceful close.
- `connection.py`: one client connection's request -> handler -> response cycles, with head, body and idle deadlines.
- `framing.py`: between h11 and handlers: a request head read and checked against the limits, response heads,
  the error responses for requests the server will not serve, the `http_request` log line.
- `routing.py`: `Request`, `Response`, `StreamResponse` and the `Router` (exact paths, 404/405).
- `errors.py`: `HttpError` and the OpenAI error envelope it is rendered in.
- `json_body.py`: the one parser of client JSON, within depth and size bounds.
- `sse.py`: server-sent events framing and keep-alive pings.
- `auth.py`: the API key (Bearer or `x-api-key`), a 401 otherwise.
- `cors.py`: CORS preflights and headers for the allowed origins.
- `busy.py`: how many requests are being answered, and a bounded wait for none.
"""
