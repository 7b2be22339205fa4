"""HTTP/1.1 server library (asyncio streams + h11) used by the OpenAI-compatible adapter."""
