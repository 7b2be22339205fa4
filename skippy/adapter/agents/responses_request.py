"""An OpenAI Responses request (`POST /v1/responses`) -> the chat completions body it means (skippy.adapter.agents.translation).

Stateless: nothing is stored, so `store` is accepted and ignored (true or false: there is no retrieval
route), and `previous_response_id`, `conversation` and `item_reference` items are a 400 naming them
(send the whole conversation in `input`). `background` and `prompt` (stored prompt templates) are refused.

- `input`: a string (one user message) or items: messages (`role` user, system, developer or assistant;
  content a string or `input_text` / `output_text` / `refusal` parts), `function_call` (an assistant
  turn's call; consecutive calls and the text before them make one turn), `function_call_output` (a
  tool result), `reasoning` items (dropped: this model does not reason). `instructions`: the system
  message, first.
- `tools`: function tools (`name`, `description`, `parameters`, `strict`) become chat function tools;
  every other type (`web_search`, `file_search`, `local_shell`, `custom`, ...) is ignored, as Codex
  needs, and logged. `tool_choice` none / auto / required / `{"type": "function", "name"}`;
  `parallel_tool_calls` as chat (one call per answer).
- `text.format`: text, json_object, json_schema (`name`, `schema`, `strict`, `description`), enforced by
  the grammar as chat's `response_format`. `max_output_tokens`, `temperature`, `top_p` as chat's; without
  `max_output_tokens` a response may run until the context is full (OpenAI's default; Codex sends none),
  not the adapter's `--default-max-tokens`.
- Accepted and meaningless here: `reasoning`, `include`, `metadata`, `prompt_cache_key`,
  `prompt_cache_retention`, `user`, `safety_identifier`, `service_tier`, `truncation`, `max_tool_calls`,
  `stream_options`, `text.verbosity`; any other field (Codex's `client_metadata`, another key of `text`) is ignored
  (skippy.adapter.request_fields).
"""

from __future__ import annotations

from typing import Any

from skippy.adapter.agents.translation import Renames, Translated, chat_tools, check_fields, format_of, keep
from skippy.adapter.chat_messages import text_parts
from skippy.http.errors import invalid
from skippy.http.json_body import JsonBodyError, loads

PASSED = ("model", "temperature", "top_p", "stream", "parallel_tool_calls", "service_tier")
MEANINGLESS = ("reasoning", "include", "metadata", "prompt_cache_key", "prompt_cache_retention", "user",
               "safety_identifier", "truncation", "max_tool_calls", "stream_options", "store", "background")
KNOWN = (*PASSED, *MEANINGLESS, "input", "instructions", "max_output_tokens", "tools", "tool_choice", "text")
NOT_STORED = "responses are not stored here (a stateless server): send the whole conversation in input"
REFUSED = {"previous_response_id": NOT_STORED, "conversation": NOT_STORED,
           "prompt": "stored prompt templates are not supported; send instructions and input"}
ROLES = frozenset({"user", "system", "developer", "assistant"})
PART_KINDS = ("input_text", "output_text", "refusal")


def _message(item: dict[str, Any], param: str) -> dict[str, Any]:
    role = item.get("role")
    if role not in ROLES:
        raise invalid(f"{param}.role", f"expected one of {sorted(ROLES)}, got {role!r}")
    return {"role": role, "content": text_parts(item.get("content", ""), f"{param}.content", PART_KINDS)}


def _string(item: dict[str, Any], key: str, param: str) -> str:
    value = item.get(key)
    if not isinstance(value, str) or not value:
        raise invalid(f"{param}.{key}", f"expected a non-empty string, got {value!r}")
    return value


def _call(item: dict[str, Any], param: str) -> dict[str, Any]:
    arguments = item.get("arguments")
    if not isinstance(arguments, str):
        raise invalid(f"{param}.arguments", "expected the call's arguments as a JSON string")
    try:
        loads(arguments)
    except JsonBodyError as exc:
        raise invalid(f"{param}.arguments", f"is not valid JSON: {exc}") from None
    return {"id": _string(item, "call_id", param), "type": "function",
            "function": {"name": _string(item, "name", param), "arguments": arguments}}


def input_messages(value: Any, instructions: Any) -> list[dict[str, Any]]:
    """`instructions` and `input` as chat messages."""
    messages: list[dict[str, Any]] = []
    if instructions is not None:
        if not isinstance(instructions, str):
            raise invalid("instructions", "expected a string")
        messages.append({"role": "system", "content": instructions})
    if isinstance(value, str):
        return [*messages, {"role": "user", "content": value}]
    if not isinstance(value, list) or not value:
        raise invalid("input", "expected a string or a non-empty list of input items")
    for i, item in enumerate(value):
        param = f"input[{i}]"
        if not isinstance(item, dict):
            raise invalid(param, "expected an input item object")
        kind = item.get("type", "message" if "role" in item else None)
        last = messages[-1] if messages else None
        if kind == "message":
            messages.append(_message(item, param))
        elif kind == "function_call":
            call = _call(item, param)
            if last is not None and last["role"] == "assistant":  # one assistant turn: its text, then its calls
                last.setdefault("tool_calls", []).append(call)
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            output = text_parts(item.get("output"), f"{param}.output", ("input_text", "output_text"))
            messages.append({"role": "tool", "tool_call_id": _string(item, "call_id", param), "content": output})
        elif kind == "reasoning":
            continue
        elif kind == "item_reference":
            raise invalid(f"{param}.type", NOT_STORED)
        else:
            raise invalid(f"{param}.type", f"{kind!r} items are not supported here (message, function_call,"
                                           " function_call_output, reasoning)")
    return messages


def _function(tool: dict[str, Any], param: str) -> dict[str, Any] | None:
    return {k: v for k, v in tool.items() if k != "type"} if tool.get("type") == "function" else None


def _tool_choice(value: Any) -> Any:
    if value is None or value in ("none", "auto", "required"):
        return value
    if isinstance(value, dict) and value.get("type") == "function":
        return {"type": "function", "function": {"name": value.get("name")}}
    raise invalid("tool_choice", 'expected "none", "auto", "required" or {"type": "function", "name": ...}'
                                 " (only function tools can be chosen)")


def _response_format(text: Any) -> dict[str, Any] | None:
    fmt = format_of(text, "text", {"format", "verbosity"}, '{"format": {...}}')
    if fmt is None or fmt.get("type") != "json_schema":
        return fmt  # text / json_object: chat's own shapes
    return {"type": "json_schema", "json_schema": {k: v for k, v in fmt.items() if k != "type"}}


def translate_responses(raw: Any) -> Translated:
    """The Responses body as a chat completions body (fields checked, names kept for errors)."""
    body = check_fields(raw, KNOWN, REFUSED)
    if body.get("background"):
        raise invalid("background", "background responses are not supported", "unsupported_parameter")
    renames: Renames = [("max_tokens", "max_output_tokens"), ("response_format.json_schema", "text.format"),
                        ("response_format", "text.format"), ("tool_choice.function.name", "tool_choice.name")]
    chat = {**keep(body, PASSED), "messages": input_messages(body.get("input"), body.get("instructions"))}
    tools = chat_tools(body.get("tools"), renames, _function, {"function": ""}, "responses")
    if tools:
        chat["tools"] = tools
    choice = _tool_choice(body.get("tool_choice"))
    if choice is not None and (tools or choice != "auto"):
        chat["tool_choice"] = choice
    if body.get("max_output_tokens") is not None:
        chat["max_tokens"] = body["max_output_tokens"]
    response_format = _response_format(body.get("text"))
    if response_format is not None:
        chat["response_format"] = response_format
    return Translated(chat, renames, prompt_param="input", up_to_context=True)


def echo_fields(body: dict[str, Any]) -> dict[str, Any]:
    """The request's settings a Response object repeats back."""
    text = body.get("text") if isinstance(body.get("text"), dict) else {}
    return {"instructions": body.get("instructions"), "max_output_tokens": body.get("max_output_tokens"),
            "temperature": body.get("temperature"), "top_p": body.get("top_p"), "tools": body.get("tools") or [],
            "tool_choice": body.get("tool_choice") or "auto", "parallel_tool_calls": body.get("parallel_tool_calls", True),
            "text": {"format": (text or {}).get("format") or {"type": "text"}},
            "reasoning": body.get("reasoning") or {"effort": None, "summary": None}, "metadata": body.get("metadata") or {},
            "prompt_cache_key": body.get("prompt_cache_key"), "user": body.get("user"), "store": False,
            "previous_response_id": None, "truncation": "disabled", "background": False,
            "service_tier": body.get("service_tier") or "default"}

