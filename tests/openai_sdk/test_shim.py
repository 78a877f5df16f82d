"""Checks `spark serve-openai` with the official `openai` Python SDK.

Run through run.sh (which makes the virtualenv). The shim's URL comes from OPENAI_BASE_URL
(default http://127.0.0.1:8080/v1); OPENAI_API_KEY is sent as the bearer token. Prints one
line per check and a closing `N passed, M failed`; exits non-zero if any check failed.
"""

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


def test_structured_output_parses_into_a_pydantic_model():
    # The SDK turns the model into a strict JSON Schema (`$defs`/`$ref` for Owner,
    # `anyOf` with null for the optional nickname, bounds, an enum) and validates the
    # answer against the model: a `Cat` here is a schema-valid answer.
    try:
        completion = client.chat.completions.parse(
            model=model_id(),
            messages=[{"role": "user", "content": "Describe a cat and its owner as JSON."}],
            response_format=Cat,
            max_tokens=200,
            temperature=0,
        )
    except openai.LengthFinishReasonError:
        # Only a synthetic model (random weights) rambles past the budget.
        assert "smollm2" not in model_id(), "the default model did not close its object"
        return
    message = completion.choices[0].message
    assert completion.choices[0].finish_reason == "stop"
    assert isinstance(message.parsed, Cat), message.content
    assert 0 <= message.parsed.age <= 40 and len(message.parsed.toys) <= 3, message.parsed


def test_a_schema_sparkd_cannot_enforce_is_a_400():
    schema = {"type": "object", "properties": {"zip": {"type": "string", "pattern": "^[0-9]{5}$"}}}
    try:
        client.chat.completions.create(
            model=model_id(),
            messages=[{"role": "user", "content": "hi"}],
            response_format={"type": "json_schema", "json_schema": {"name": "zip", "schema": schema}},
        )
    except openai.BadRequestError as err:
        assert err.status_code == 400
        assert "pattern" in str(err) and "/properties/zip" in str(err), str(err)
    else:
        raise AssertionError("a schema with `pattern` was accepted")


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


TESTS = [
    test_models_list,
    test_chat_streaming_with_usage,
    test_chat_non_streaming,
    test_text_completion,
    test_a_repeated_prompt_reports_cached_tokens,
    test_json_object_output_parses,
    test_structured_output_parses_into_a_pydantic_model,
    test_a_schema_sparkd_cannot_enforce_is_a_400,
    test_invalid_request_is_a_400,
]


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
