"""Checks `spark serve-openai` with the official `openai` Python SDK.

Run through run.sh (which makes the virtualenv). The shim's URL comes from OPENAI_BASE_URL
(default http://127.0.0.1:8080/v1); OPENAI_API_KEY is sent as the bearer token. Prints one
line per check and a closing `N passed, M failed`; exits non-zero if any check failed.
"""

import datetime
import json
import math
import os
import sys
import traceback
import typing

import openai
import pydantic

BASE_URL = os.environ.get("OPENAI_BASE_URL", "http://127.0.0.1:8080/v1")
# The SDK insists on a key; the shim only checks it when started with --api-key.
API_KEY = os.environ.get("OPENAI_API_KEY") or "sk-no-key"
MAX_TOKENS = 24

client = openai.OpenAI(base_url=BASE_URL, api_key=API_KEY, timeout=120.0, max_retries=0)
state = {}


def model_id():
    if "model" not in state:
        state["model"] = client.models.list().data[0].id
    return state["model"]


def check_usage(usage, where):
    assert usage is not None, f"{where}: no usage"
    assert usage.prompt_tokens > 0, f"{where}: prompt_tokens={usage.prompt_tokens}"
    assert 0 < usage.completion_tokens <= MAX_TOKENS, f"{where}: completion_tokens={usage.completion_tokens}"
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens, f"{where}: {usage}"
    extra = usage.model_extra or {}
    for field in ("ttft_ms", "decode_tps", "queue_ms", "prefill_ms", "decode_ms", "generation_ms"):
        assert field in extra, f"{where}: usage has no '{field}': {extra}"
    ttft = extra["ttft_ms"]
    assert isinstance(ttft, (int, float)) and ttft > 0 and math.isfinite(ttft), f"{where}: ttft_ms={ttft}"
    # decode_tps is null when fewer than two tokens were generated.
    tps = extra["decode_tps"]
    if usage.completion_tokens >= 2:
        assert isinstance(tps, (int, float)) and tps > 0, f"{where}: decode_tps={tps}"
    return extra


def test_models_list():
    models = client.models.list().data
    assert models, "no models listed"
    for m in models:
        assert m.id and m.object == "model", m


def test_chat_streaming_with_usage():
    stream = client.chat.completions.create(
        model=model_id(),
        messages=[{"role": "user", "content": "Say hello in one short sentence."}],
        max_tokens=MAX_TOKENS,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert len(chunks) >= 3, f"only {len(chunks)} chunks"
    ids = {c.id for c in chunks}
    assert len(ids) == 1 and ids.pop().startswith("chatcmpl-"), "one chatcmpl- id per stream"
    *content_chunks, usage_chunk = chunks
    assert usage_chunk.choices == [], f"last chunk has choices: {usage_chunk}"
    assert content_chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in content_chunks)
    assert text.strip(), "empty streamed text"
    reasons = [c.choices[0].finish_reason for c in content_chunks if c.choices[0].finish_reason]
    assert reasons in (["stop"], ["length"]), f"finish reasons {reasons}"
    assert all(c.usage is None for c in content_chunks), "usage before the last chunk"
    check_usage(usage_chunk.usage, "stream")


def test_chat_non_streaming():
    response = client.chat.completions.create(
        model=model_id(),
        messages=[
            {"role": "system", "content": "You are a helpful assistant."},
            {"role": "user", "content": "What is the capital of France?"},
        ],
        max_tokens=MAX_TOKENS,
        temperature=0,
    )
    assert response.object == "chat.completion" and response.id.startswith("chatcmpl-")
    choice = response.choices[0]
    assert choice.message.role == "assistant"
    assert choice.message.content and choice.message.content.strip(), "empty reply"
    assert choice.finish_reason in ("stop", "length"), choice.finish_reason
    check_usage(response.usage, "chat")


def test_text_completion():
    response = client.completions.create(
        model=model_id(),
        prompt="The three primary colors are",
        max_tokens=MAX_TOKENS,
        temperature=0,
    )
    assert response.object == "text_completion" and response.id.startswith("cmpl-")
    text = response.choices[0].text
    assert text.strip(), "empty completion"
    assert response.choices[0].finish_reason in ("stop", "length")
    check_usage(response.usage, "completion")


def test_logprobs_bytes_are_each_tokens_own():
    # SmolLM2's byte-level vocabulary writes an emoji over several tokens: each entry's
    # `bytes` are that token's, put end to end they are the text, and a token that is
    # part of a character reads `bytes:\x..` (as OpenAI writes it), not U+FFFD.
    messages = [{"role": "user", "content": "Reply with only a smiley emoji and the Chinese word for hello."}]
    for stream in (False, True):
        response = client.chat.completions.create(
            model=model_id(), messages=messages, max_tokens=MAX_TOKENS, temperature=0,
            logprobs=True, top_logprobs=2, stream=stream,
        )
        if stream:
            chunks = [c for c in response if c.choices]
            text = "".join(c.choices[0].delta.content or "" for c in chunks)
            entries = [e for c in chunks if c.choices[0].logprobs for e in c.choices[0].logprobs.content]
        else:
            text = response.choices[0].message.content
            entries = response.choices[0].logprobs.content
        where = "stream" if stream else "body"
        assert entries and all(len(e.top_logprobs) == 2 for e in entries), f"{where}: {entries}"
        joined = b"".join(bytes(e.bytes) for e in entries)
        # What the model wrote: the content, then the end-of-generation token's text
        # when it stopped on one.
        assert joined.decode("utf-8", "replace").startswith(text), f"{where}: {joined!r} vs {text!r}"
        partial = [e for e in entries if not _utf8(bytes(e.bytes))]
        # The default model answers with emojis; a synthetic one may write none.
        if any(ord(ch) > 0xFFFF for ch in text):
            assert partial, f"{where}: an emoji in {text!r} but no token holds part of one"
        for e in partial + [t for e in entries for t in e.top_logprobs if not _utf8(bytes(t.bytes))]:
            assert "\ufffd" not in e.token and e.token.startswith("bytes:\\x"), f"{where}: {e}"


def _utf8(data):
    try:
        data.decode("utf-8")
        return True
    except UnicodeDecodeError:
        return False


def test_a_repeated_prompt_reports_cached_tokens():
    # Long enough to fill several of the daemon's 16-token KV blocks.
    messages = [
        {"role": "system", "content": "You answer questions about geography. " * 6},
        {"role": "user", "content": "Name a large river."},
    ]
    usages = []
    for _ in range(2):
        response = client.chat.completions.create(
            model=model_id(), messages=messages, max_tokens=4, temperature=0
        )
        usage = response.usage
        details = usage.prompt_tokens_details
        assert details is not None, f"no prompt_tokens_details: {usage}"
        usages.append((usage.prompt_tokens, details.cached_tokens))
    (prompt, _), (again, cached) = usages
    assert again == prompt, usages
    # Every whole block of the prompt but the one holding its last token.
    assert cached == (prompt - 1) // 16 * 16 and cached >= 48, usages


def test_json_object_output_parses():
    response = client.chat.completions.create(
        model=model_id(),
        messages=[{"role": "user", "content": "Describe a cat as JSON with name, age and color."}],
        response_format={"type": "json_object"},
        max_tokens=200,
        temperature=0,
    )
    choice = response.choices[0]
    content = choice.message.content
    if choice.finish_reason == "length":
        # Only a synthetic model (random weights) rambles past the budget; what it wrote
        # still opens an object.
        assert "smollm2" not in model_id(), f"the default model did not close its object: {content!r}"
        assert content.lstrip().startswith("{"), content
        return
    assert choice.finish_reason == "stop", choice.finish_reason
    value = json.loads(content)
    assert isinstance(value, dict), content


class Owner(pydantic.BaseModel):
    name: str = pydantic.Field(max_length=30)


class Cat(pydantic.BaseModel):
    name: str = pydantic.Field(max_length=30)
    age: int = pydantic.Field(ge=0, le=40)
    color: typing.Literal["black", "white", "orange", "grey", "tabby"]
    indoor: bool
    toys: typing.List[str] = pydantic.Field(max_length=3)
    nickname: typing.Optional[str]
    owner: Owner


def parse_greedy(prompt, model):
    """The answer to `prompt` parsed into `model` by the SDK, or None when a synthetic
    model (random weights) rambled past the budget; the default model always closes
    its object."""
    try:
        completion = client.chat.completions.parse(
            model=model_id(),
            messages=[{"role": "user", "content": prompt}],
            response_format=model,
            max_tokens=200,
            temperature=0,
        )
    except openai.LengthFinishReasonError:
        assert "smollm2" not in model_id(), "the default model did not close its object"
        return None
    choice = completion.choices[0]
    assert choice.finish_reason == "stop"
    assert isinstance(choice.message.parsed, model), choice.message.content
    return choice.message.parsed


def test_structured_output_parses_into_a_pydantic_model():
    # The SDK turns the model into a strict JSON Schema (`$defs`/`$ref` for Owner,
    # `anyOf` with null for the optional nickname, bounds, an enum) and validates the
    # answer against the model: a `Cat` here is a schema-valid answer.
    cat = parse_greedy("Describe a cat and its owner as JSON.", Cat)
    if cat is not None:
        assert 0 <= cat.age <= 40 and len(cat.toys) <= 3, cat


class Visit(pydantic.BaseModel):
    code: str = pydantic.Field(pattern=r"^[A-Z]{3}-[0-9]{3}$")
    day: datetime.date
    starts: datetime.datetime
    # A bound keeps a small model from rambling inside the address.
    visitor: str = pydantic.Field(max_length=40, json_schema_extra={"format": "email"})
    spot: typing.Tuple[float, float]
    extras: typing.Set[typing.Literal["parking", "wifi", "lunch"]]


def test_patterns_formats_and_tuples_are_enforced():
    # pydantic writes `pattern` for the constrained string, `format` for the date, the
    # datetime and the e-mail, `prefixItems` for the tuple and `uniqueItems` for the
    # set; pydantic's own parsing of the answer checks them.
    visit = parse_greedy("Book a visit as JSON.", Visit)
    if visit is not None:
        assert "@" in visit.visitor and "." in visit.visitor.split("@")[1], visit.visitor


class ByCity(pydantic.BaseModel):
    city: str = pydantic.Field(max_length=30)


class ByCoordinates(pydantic.BaseModel):
    lat: float = pydantic.Field(ge=-90, le=90)
    lon: float = pydantic.Field(ge=-180, le=180)


class Place(pydantic.BaseModel):
    name: str = pydantic.Field(max_length=30)
    where: typing.Union[ByCity, ByCoordinates]


def test_a_union_of_models_without_a_tag_is_enforced():
    # No `Literal` field tells the two apart: `anyOf` of two closed objects, each
    # requiring a key the other does not list (`city`, `lat`), which picks it.
    place = parse_greedy("Name a place and where it is, as JSON.", Place)
    if place is not None:
        assert isinstance(place.where, (ByCity, ByCoordinates)), place


def test_a_schema_sparkd_cannot_enforce_is_a_400():
    schema = {"type": "object", "properties": {"zip": {"type": "string", "not": {"const": "00000"}}}}
    try:
        client.chat.completions.create(
            model=model_id(),
            messages=[{"role": "user", "content": "hi"}],
            response_format={"type": "json_schema", "json_schema": {"name": "zip", "schema": schema}},
        )
    except openai.BadRequestError as err:
        assert err.status_code == 400
        assert "`not`" in str(err) and "/properties/zip" in str(err), str(err)
    else:
        raise AssertionError("a schema with `not` was accepted")


WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "The city, e.g. Paris"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city"],
            "additionalProperties": False,
        },
    },
}
WEATHER_QUESTION = [{"role": "user", "content": "What is the weather like in Paris today?"}]
# Room for a call's arguments; the daemon holds them to the tool's schema.
TOOL_MAX_TOKENS = 200


def cut_short(finish_reason, what):
    """A synthetic model (random weights) may ramble past the budget inside the
    arguments; the default model must not. True when the check should stop here."""
    if finish_reason != "length":
        return False
    assert "smollm2" not in model_id(), f"the default model did not finish {what}"
    return True


def check_weather_call(call):
    assert call.type == "function", call
    assert call.id, call
    assert call.function.name == "get_weather", call
    arguments = json.loads(call.function.arguments)
    assert isinstance(arguments, dict), call.function.arguments
    assert isinstance(arguments.get("city"), str), call.function.arguments
    assert arguments.get("unit", "celsius") in ("celsius", "fahrenheit"), call.function.arguments


def required_weather_call():
    """(a) A required call of get_weather, cached for the follow-up turn."""
    if "weather" not in state:
        state["weather"] = client.chat.completions.create(
            model=model_id(),
            messages=WEATHER_QUESTION,
            tools=[WEATHER_TOOL],
            tool_choice="required",
            # One call, whatever the model would like: "exactly one" is then a rule.
            parallel_tool_calls=False,
            max_tokens=TOOL_MAX_TOKENS,
            temperature=0,
        )
    return state["weather"]


def test_a_required_tool_call():
    response = required_weather_call()
    choice = response.choices[0]
    if cut_short(choice.finish_reason, "its call"):
        return
    assert choice.finish_reason == "tool_calls", choice.finish_reason
    assert choice.message.content is None, choice.message.content
    calls = choice.message.tool_calls
    assert calls is not None and len(calls) == 1, calls
    check_weather_call(calls[0])
    assert 0 < response.usage.completion_tokens <= TOOL_MAX_TOKENS, response.usage


def test_a_streamed_tool_call():
    stream = client.chat.completions.create(
        model=model_id(),
        messages=WEATHER_QUESTION,
        tools=[WEATHER_TOOL],
        tool_choice="required",
        parallel_tool_calls=False,
        max_tokens=TOOL_MAX_TOKENS,
        temperature=0,
        stream=True,
    )
    # As OpenAI's function-calling guide accumulates a stream's calls.
    final_tool_calls = {}
    finish_reasons = []
    argument_chunks = 0
    for chunk in stream:
        if not chunk.choices:
            continue
        for tool_call in chunk.choices[0].delta.tool_calls or []:
            index = tool_call.index
            if index not in final_tool_calls:
                final_tool_calls[index] = tool_call
            final_tool_calls[index].function.arguments += tool_call.function.arguments
            argument_chunks += bool(tool_call.function.arguments)
        if chunk.choices[0].finish_reason:
            finish_reasons.append(chunk.choices[0].finish_reason)
    assert len(finish_reasons) == 1, finish_reasons
    if cut_short(finish_reasons[0], "its streamed call"):
        return
    assert finish_reasons == ["tool_calls"], finish_reasons
    assert list(final_tool_calls) == [0], final_tool_calls
    check_weather_call(final_tool_calls[0])
    # The arguments came as the model wrote them, not in one piece once the call was
    # complete (`{"city": "Paris"}` is several tokens in any vocabulary).
    assert argument_chunks >= 2, (argument_chunks, final_tool_calls[0].function.arguments)

    # The SDK's own stream helper puts the same call together.
    with client.chat.completions.stream(
        model=model_id(),
        messages=WEATHER_QUESTION,
        tools=[WEATHER_TOOL],
        tool_choice="required",
        parallel_tool_calls=False,
        max_tokens=TOOL_MAX_TOKENS,
        temperature=0,
    ) as helper:
        final = helper.get_final_completion()
    calls = final.choices[0].message.tool_calls
    assert calls is not None and len(calls) == 1, calls
    check_weather_call(calls[0])


def test_a_named_tool_choice():
    response = client.chat.completions.create(
        model=model_id(),
        messages=WEATHER_QUESTION,
        tools=[WEATHER_TOOL],
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
        max_tokens=TOOL_MAX_TOKENS,
        temperature=0,
    )
    choice = response.choices[0]
    if cut_short(choice.finish_reason, "its call"):
        return
    assert choice.finish_reason == "tool_calls", choice.finish_reason
    calls = choice.message.tool_calls
    assert calls is not None and len(calls) == 1, calls
    check_weather_call(calls[0])


def test_a_tool_result_gets_a_text_answer():
    first = required_weather_call()
    message = first.choices[0].message
    if not message.tool_calls:
        # Only a synthetic model runs out of budget before its call (checked above).
        assert "smollm2" not in model_id(), "no call to answer"
        return
    call = message.tool_calls[0]
    response = client.chat.completions.create(
        model=model_id(),
        messages=WEATHER_QUESTION
        + [
            # As the SDK docs do: the assistant message as it came back.
            message,
            {"role": "tool", "tool_call_id": call.id, "content": "Sunny, 21 degrees celsius."},
        ],
        tools=[WEATHER_TOOL],
        tool_choice="none",
        max_tokens=MAX_TOKENS,
        temperature=0,
    )
    choice = response.choices[0]
    assert choice.finish_reason in ("stop", "length"), choice.finish_reason
    assert not choice.message.tool_calls, choice.message.tool_calls
    assert choice.message.content and choice.message.content.strip(), "empty reply"
    check_usage(response.usage, "tool result")


def test_invalid_request_is_a_400():
    try:
        client.chat.completions.create(
            model=model_id(), messages=[{"role": "user", "content": "hi"}], n=2
        )
    except openai.BadRequestError as err:
        assert err.status_code == 400
        assert "n" in str(err)
    else:
        raise AssertionError("n=2 was accepted")


def test_chat_template_kwargs_pass_through_extra_body():
    # What vLLM and llama-server clients send for Qwen 3's `enable_thinking`.
    answer = client.chat.completions.create(
        model=model_id(),
        messages=[{"role": "user", "content": "hi"}],
        max_tokens=MAX_TOKENS,
        extra_body={"chat_template_kwargs": {"enable_thinking": False}},
    )
    check_usage(answer.usage, "chat_template_kwargs")
    # OpenAI's own reasoning_effort reaches the template as `reasoning_effort`.
    answer = client.chat.completions.create(
        model=model_id(),
        messages=[{"role": "user", "content": "hi"}],
        max_tokens=MAX_TOKENS,
        reasoning_effort="high",
    )
    check_usage(answer.usage, "reasoning_effort")
    # A name the daemon sets itself is refused, with the name.
    try:
        client.chat.completions.create(
            model=model_id(),
            messages=[{"role": "user", "content": "hi"}],
            extra_body={"chat_template_kwargs": {"messages": []}},
        )
    except openai.BadRequestError as err:
        assert err.status_code == 400
        assert "`messages` is set by sparkd itself" in str(err), str(err)
    else:
        raise AssertionError("chat_template_kwargs.messages was accepted")


# Every `test_` function, in the order they are defined: a new one cannot be left out.
TESTS = [f for name, f in list(globals().items()) if name.startswith("test_") and callable(f)]


def main():
    print(f"openai {openai.__version__} against {BASE_URL}")
    passed = failed = 0
    for test in TESTS:
        try:
            test()
        except Exception:  # noqa: BLE001 - report every failure, keep going
            failed += 1
            print(f"FAIL {test.__name__}")
            traceback.print_exc()
        else:
            passed += 1
            print(f"ok   {test.__name__}")
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
