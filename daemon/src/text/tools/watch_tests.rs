//! Tests of the call watcher.

use super::*;
use serde_json::json;
use spark_client::protocol::{ToolChoice, ToolSpec};

fn tools(choice: ToolChoice, parallel: bool) -> ToolSet {
    tools_in(CallSyntax::Hermes, choice, parallel)
}

fn tools_in(syntax: CallSyntax, choice: ToolChoice, parallel: bool) -> ToolSet {
    let weather = ToolSpec {
        name: "get_weather".into(),
        description: "Weather in a city".into(),
        parameters: json!({
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        })
        .to_string(),
        strict: false,
    };
    let time = ToolSpec {
        name: "get_time".into(),
        description: String::new(),
        parameters: String::new(),
        strict: false,
    };
    ToolSet::prepare(&[weather, time], &choice, parallel, syntax)
        .unwrap()
        .unwrap()
}

/// The JSON constraint of the call being written.
fn json_of(w: &mut CallWatcher) -> &mut JsonConstraint {
    match w.constraint() {
        Some(CallConstraint::Json(c)) => c,
        _ => panic!("no call's JSON is being written"),
    }
}

/// Feeds `text` in pieces of `step` bytes; the text, the calls and whether it ended.
fn run(watcher: &mut CallWatcher, text: &str, step: usize) -> (String, Vec<ToolCall>, bool) {
    let (mut bytes, mut calls, mut end) = (Vec::new(), Vec::new(), false);
    for piece in text.as_bytes().chunks(step) {
        let w = watcher.push(piece);
        bytes.extend(w.text);
        calls.extend(w.calls);
        end |= w.end;
    }
    if !end {
        bytes.extend(watcher.finish());
    }
    (String::from_utf8(bytes).unwrap(), calls, end)
}

#[test]
fn text_without_calls_passes_through_whole() {
    for step in [1, 3, 64] {
        let mut w = CallWatcher::new(tools(ToolChoice::Auto, true), false, ThinkTags::XML);
        let text = "a < b, <tool and <tool_cal> are not tags; x<";
        let (out, calls, end) = run(&mut w, text, step);
        assert_eq!(out, text);
        assert!(calls.is_empty() && !end);
    }
}

#[test]
fn calls_are_taken_out_of_the_text_at_any_token_split() {
    let text = "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n</tool_call>";
    for step in 1..=12 {
        let mut w = CallWatcher::new(tools(ToolChoice::Auto, true), false, ThinkTags::XML);
        let (out, calls, end) = run(&mut w, text, step);
        assert_eq!(out, "Let me check.\n", "step {step}");
        assert!(!end);
        assert_eq!(calls.len(), 2);
        assert_eq!(calls[0].name, "get_weather");
        assert_eq!(calls[0].arguments, r#"{"city":"Oslo"}"#);
        assert_eq!(calls[1].name, "get_time");
        assert_eq!(calls[1].arguments, "{}");
        assert!(calls[0].id.starts_with("call_") && calls[0].id.len() == 29);
        assert_ne!(calls[0].id, calls[1].id);
    }
}

#[test]
fn the_constraint_holds_only_while_a_call_is_written() {
    let mut w = CallWatcher::new(tools(ToolChoice::Auto, true), false, ThinkTags::XML);
    assert!(w.is_free());
    w.push(b"Hi <tool_");
    assert!(w.is_free());
    w.push(b"call>");
    assert!(!w.is_free(), "armed once the tag is whole");
    w.push(br#"{"name": "get_time", "arguments": {}"#);
    assert!(!w.is_free());
    let done = w.push(b"}");
    assert_eq!(done.calls.len(), 1);
    assert!(w.is_free());
}

#[test]
fn a_forced_call_starts_at_once_and_ends_the_answer() {
    let mut w = CallWatcher::new(tools(ToolChoice::Required, true), false, ThinkTags::XML);
    assert!(!w.is_free(), "the prompt wrote the tag");
    let (out, calls, end) = run(
        &mut w,
        "\n{\"name\": \"get_time\", \"arguments\": {}}\n</tool_call>",
        5,
    );
    assert!(end);
    assert_eq!(out, "");
    assert_eq!(calls.len(), 1);
}

#[test]
fn a_call_that_is_cut_short_is_given_back_as_text() {
    let mut w = CallWatcher::new(tools(ToolChoice::Auto, true), false, ThinkTags::XML);
    let text = "<tool_call>\n{\"name\": \"get_weather\", \"argu";
    let (out, calls, _) = run(&mut w, text, 4);
    assert_eq!(out, text);
    assert!(calls.is_empty());
}

#[test]
fn a_tag_followed_by_what_no_call_begins_with_is_text() {
    // The rest of the tag's token is refused by the call schema: no call.
    let mut w = CallWatcher::new(tools(ToolChoice::Auto, true), false, ThinkTags::XML);
    let (out, calls, _) = run(&mut w, "<tool_call>oops, a tag", 64);
    assert_eq!(out, "<tool_call>oops, a tag");
    assert!(calls.is_empty());
}

#[test]
fn a_llama_answer_that_begins_with_a_brace_is_one_call() {
    let text = "\n {\"name\": \"get_weather\", \"parameters\": {\"city\": \"Oslo\"}}";
    for step in [1, 2, 5, 64] {
        let mut w = CallWatcher::new(
            tools_in(CallSyntax::LlamaJson, ToolChoice::Auto, true),
            false,
            ThinkTags::XML,
        );
        assert!(
            w.is_free(),
            "free until the first byte that is not whitespace"
        );
        let (out, calls, end) = run(&mut w, text, step);
        assert_eq!(out, "", "step {step}");
        assert!(end, "one call is the whole answer");
        assert_eq!(calls.len(), 1);
        assert_eq!(calls[0].name, "get_weather");
        assert_eq!(calls[0].arguments, r#"{"city":"Oslo"}"#);
    }
}

#[test]
fn a_llama_answer_that_begins_otherwise_is_text_to_the_end() {
    let mut w = CallWatcher::new(
        tools_in(CallSyntax::LlamaJson, ToolChoice::Auto, true),
        false,
        ThinkTags::XML,
    );
    let text = "  It is {\"name\": \"get_time\", \"parameters\": {}} <tool_call>";
    let (out, calls, end) = run(&mut w, text, 3);
    assert_eq!(out, text);
    assert!(calls.is_empty() && !end);
    // Held to the call schema once it begins: `arguments` is not the Llama key.
    let mut w = CallWatcher::new(
        tools_in(CallSyntax::LlamaJson, ToolChoice::Auto, true),
        false,
        ThinkTags::XML,
    );
    w.push(b"{");
    let c = json_of(&mut w);
    assert!(c.accept(br#""name": "get_time", "#));
    assert!(!c.clone().accept(br#""arguments""#));
    assert!(c.accept(br#""parameters": {}}"#));
}

#[test]
fn a_forced_llama_call_is_held_from_the_first_token() {
    let mut w = CallWatcher::new(
        tools_in(CallSyntax::LlamaJson, ToolChoice::Required, true),
        false,
        ThinkTags::XML,
    );
    assert!(!w.is_free(), "no tag: the answer is the call");
    let (out, calls, end) = run(&mut w, "{\"name\": \"get_time\", \"parameters\": {}}", 4);
    assert!(end && out.is_empty());
    assert_eq!(calls.len(), 1);
    // Cut short: given back as the text it was.
    let mut w = CallWatcher::new(
        tools_in(CallSyntax::LlamaJson, ToolChoice::Auto, true),
        false,
        ThinkTags::XML,
    );
    let text = " {\"name\": \"get_weather\", \"param";
    let (out, calls, _) = run(&mut w, text, 4);
    assert_eq!(out, text);
    assert!(calls.is_empty());
}

#[test]
fn calls_are_held_to_the_offered_tools() {
    let mut w = CallWatcher::new(tools(ToolChoice::Auto, true), false, ThinkTags::XML);
    w.push(b"<tool_call>");
    let c = json_of(&mut w);
    assert!(c.accept(br#"{"name": "get_"#));
    let mut refused = c.clone();
    assert!(!refused.accept(b"x"), "no tool is named get_x");
    let mut missing_city = c.clone();
    assert!(missing_city.accept(br#"weather", "arguments": {"#));
    assert!(!missing_city.accept(b"}"), "city is required");
}

#[test]
fn no_call_is_taken_inside_the_answers_thinking() {
    let call = "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n</tool_call>";
    let thinking = "<think>\nI could write <tool_call> here.\n</think>\n\n";
    for step in 1..=9 {
        let mut w = CallWatcher::new(tools(ToolChoice::Auto, true), false, ThinkTags::XML);
        let (out, calls, _) = run(&mut w, &format!("  {thinking}{call}"), step);
        assert_eq!(out, format!("  {thinking}"), "step {step}");
        assert_eq!(calls.len(), 1, "step {step}");
        assert_eq!(calls[0].name, "get_time");
        // The prompt opened the thinking: only its closing tag is written.
        let mut w = CallWatcher::new(tools(ToolChoice::Auto, true), true, ThinkTags::XML);
        let text = format!("Mentioning <tool_call> {{\"name\": 1}}</think>{call}");
        let (out, calls, _) = run(&mut w, &text, step);
        assert_eq!(
            out, "Mentioning <tool_call> {\"name\": 1}</think>",
            "step {step}"
        );
        assert_eq!(calls.len(), 1, "step {step}");
    }
    // A Llama answer after thinking is a call when it begins with a brace.
    let mut w = CallWatcher::new(
        tools_in(CallSyntax::LlamaJson, ToolChoice::Auto, true),
        false,
        ThinkTags::XML,
    );
    let text = "<think>{no}</think>\n{\"name\": \"get_time\", \"parameters\": {}}";
    let (out, calls, end) = run(&mut w, text, 3);
    // (The whitespace before a Llama call goes with the call, as without thinking.)
    assert_eq!(out, "<think>{no}</think>");
    assert!(end && calls.len() == 1);
    // `<think>` later in the answer is nothing special.
    let mut w = CallWatcher::new(tools(ToolChoice::Auto, true), false, ThinkTags::XML);
    let (out, calls, _) = run(&mut w, &format!("Hi <think> {call}"), 4);
    assert_eq!(out, "Hi <think> ");
    assert_eq!(calls.len(), 1);
    // Held bytes that turn out not to open a thinking block are not lost.
    let mut w = CallWatcher::new(tools(ToolChoice::Auto, true), false, ThinkTags::XML);
    let (out, calls, _) = run(&mut w, " <thin", 2);
    assert_eq!(out, " <thin");
    assert!(calls.is_empty());
}

#[test]
fn mistral_calls_are_one_array_after_the_tag_and_end_the_answer() {
    let text = "Checking. [TOOL_CALLS][{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}, {\"name\": \"get_time\", \"arguments\": {}}]";
    for step in 1..=14 {
        let mut w = CallWatcher::new(
            tools_in(CallSyntax::Mistral, ToolChoice::Auto, true),
            false,
            ThinkTags::XML,
        );
        let (out, calls, end) = run(&mut w, text, step);
        assert_eq!(out, "Checking. ", "step {step}");
        assert!(end, "the array holds every call of the turn");
        assert_eq!(calls.len(), 2);
        assert_eq!(calls[0].name, "get_weather");
        assert_eq!(calls[0].arguments, r#"{"city":"Oslo"}"#);
        assert_eq!(calls[1].name, "get_time");
        for call in &calls {
            assert_eq!(call.id.len(), 9, "Mistral's templates take 9-character ids");
            assert!(call.id.bytes().all(|b| b.is_ascii_alphanumeric()));
        }
        assert_ne!(calls[0].id, calls[1].id);
    }
    // A bracket or a tag's beginning in text is only text.
    let mut w = CallWatcher::new(
        tools_in(CallSyntax::Mistral, ToolChoice::Auto, true),
        false,
        ThinkTags::XML,
    );
    let text = "[1, 2] and [TOOL_CALL] and [TOOL_";
    let (out, calls, end) = run(&mut w, text, 2);
    assert_eq!(out, text);
    assert!(calls.is_empty() && !end);
}

#[test]
fn a_forced_mistral_call_starts_at_once() {
    let mut w = CallWatcher::new(
        tools_in(CallSyntax::Mistral, ToolChoice::Required, false),
        false,
        ThinkTags::XML,
    );
    assert!(!w.is_free(), "the prompt wrote `[TOOL_CALLS]`");
    let (out, calls, end) = run(&mut w, r#"[{"name": "get_time", "arguments": {}}]"#, 4);
    assert_eq!((out.as_str(), calls.len(), end), ("", 1, true));
    // Cut short, the call so far comes back as text.
    let mut w = CallWatcher::new(
        tools_in(CallSyntax::Mistral, ToolChoice::Required, false),
        false,
        ThinkTags::XML,
    );
    let (out, calls, end) = run(&mut w, r#"[{"name": "get_ti"#, 4);
    assert_eq!(
        (out.as_str(), calls.len(), end),
        (r#"[{"name": "get_ti"#, 0, false)
    );
}

fn args_tools(call_ids: bool, choice: ToolChoice, parallel: bool) -> ToolSet {
    tools_in(CallSyntax::MistralArgs { call_ids }, choice, parallel)
}

#[test]
fn args_calls_are_a_held_header_then_the_tools_own_arguments() {
    let text =
        "Sure. [TOOL_CALLS]get_weather[ARGS]{\"city\": \"Oslo\"}[TOOL_CALLS]get_time[ARGS]{}";
    for step in 1..=9 {
        let mut w = CallWatcher::new(
            args_tools(false, ToolChoice::Auto, true),
            false,
            ThinkTags::XML,
        );
        let (out, calls, end) = run(&mut w, text, step);
        assert_eq!(out, "Sure. ", "step {step}");
        assert!(!end, "more calls (or text) may follow");
        assert_eq!(calls.len(), 2, "step {step}");
        assert_eq!(
            (calls[0].name.as_str(), calls[0].arguments.as_str()),
            ("get_weather", r#"{"city":"Oslo"}"#)
        );
        assert_eq!(
            (calls[1].name.as_str(), calls[1].arguments.as_str()),
            ("get_time", "{}")
        );
        assert_eq!(calls[0].id.len(), 9);
    }
    // One call only: the first ends the answer.
    let mut w = CallWatcher::new(
        args_tools(false, ToolChoice::Auto, false),
        false,
        ThinkTags::XML,
    );
    let (_, calls, end) = run(&mut w, text, 5);
    assert_eq!((calls.len(), end), (1, true));
}

#[test]
fn the_header_and_then_the_arguments_are_constrained() {
    let mut w = CallWatcher::new(
        args_tools(true, ToolChoice::Auto, true),
        false,
        ThinkTags::XML,
    );
    assert!(w.is_free());
    w.push(b"[TOOL_CALLS]");
    assert!(matches!(w.constraint(), Some(CallConstraint::Header(_))));
    assert!(!w.is_free());
    w.push(b"get_weather[CALL_ID]a1B2c3D4e");
    assert!(matches!(w.constraint(), Some(CallConstraint::Header(_))));
    w.push(b"[ARGS]");
    // The arguments are held to get_weather's own schema: `city` is required.
    let c = json_of(&mut w);
    assert!(!c.clone().accept(b"{}"));
    let done = w.push(br#"{"city": "Oslo"}"#);
    assert_eq!(done.calls.len(), 1);
    assert_eq!(done.calls[0].id, "a1B2c3D4e", "the id the model wrote");
    assert!(w.is_free());
}

#[test]
fn an_args_header_no_mask_checked_that_fits_no_tool_is_text() {
    // The rest of the token that wrote the tag is the only unchecked text.
    let mut w = CallWatcher::new(
        args_tools(false, ToolChoice::Auto, true),
        false,
        ThinkTags::XML,
    );
    let (out, calls, _) = run(&mut w, "[TOOL_CALLS]nope and more", 64);
    assert_eq!(out, "[TOOL_CALLS]nope and more");
    assert!(calls.is_empty());
    // Cut short in the header or the arguments: all of it comes back as text.
    let mut w = CallWatcher::new(
        args_tools(false, ToolChoice::Required, true),
        false,
        ThinkTags::XML,
    );
    assert!(matches!(w.constraint(), Some(CallConstraint::Header(_))));
    let (out, calls, end) = run(&mut w, "get_wea", 3);
    assert_eq!((out.as_str(), calls.len(), end), ("get_wea", 0, false));
    let mut w = CallWatcher::new(
        args_tools(false, ToolChoice::Required, true),
        false,
        ThinkTags::XML,
    );
    let (out, _, _) = run(&mut w, "get_time[ARGS]{\"a", 3);
    assert_eq!(out, "get_time[ARGS]{\"a");
}

#[test]
fn no_call_is_taken_inside_a_mistral_models_thinking() {
    let text = "[THINK]maybe [TOOL_CALLS]get_time[ARGS]{}?[/THINK][TOOL_CALLS]get_time[ARGS]{}";
    for step in [1, 4, 64] {
        let mut w = CallWatcher::new(
            args_tools(false, ToolChoice::Auto, false),
            false,
            ThinkTags::MISTRAL,
        );
        let (out, calls, end) = run(&mut w, text, step);
        assert_eq!(
            out, "[THINK]maybe [TOOL_CALLS]get_time[ARGS]{}?[/THINK]",
            "step {step}"
        );
        assert_eq!((calls.len(), end), (1, true), "step {step}");
    }
}

/// Feeds `text` to a streaming watcher in pieces of `step` bytes; the text, the calls,
/// and the pieces of calls in the order they came.
fn run_streaming(
    tools: ToolSet,
    text: &str,
    step: usize,
) -> (String, Vec<ToolCall>, Vec<CallDelta>) {
    let mut watcher = CallWatcher::new(tools, false, ThinkTags::XML).streaming();
    let (mut bytes, mut calls, mut deltas, mut end) = (Vec::new(), Vec::new(), Vec::new(), false);
    for piece in text.as_bytes().chunks(step) {
        let w = watcher.push(piece);
        bytes.extend(w.text);
        // A call's pieces all come before the call itself.
        for call_index in watcher.calls() - w.calls.len() as u32..watcher.calls() {
            assert!(deltas
                .iter()
                .chain(&w.deltas)
                .any(|d: &CallDelta| d.index == call_index));
        }
        deltas.extend(w.deltas);
        calls.extend(w.calls);
        end |= w.end;
    }
    if !end {
        bytes.extend(watcher.finish());
    }
    (String::from_utf8(bytes).unwrap(), calls, deltas)
}

/// Each call's pieces: one opening first, with the call's own id and name, then
/// arguments that add up to the call's.
fn assert_pieces_make_the_calls(calls: &[ToolCall], deltas: &[CallDelta], context: &str) {
    for (index, call) in calls.iter().enumerate() {
        let pieces: Vec<&CallDelta> = deltas.iter().filter(|d| d.index == index as u32).collect();
        assert!(
            !pieces.is_empty(),
            "{context}: call {index} was not streamed"
        );
        let opening = pieces[0]
            .opening
            .as_ref()
            .expect("the first piece opens the call");
        assert_eq!(
            (&opening.id, &opening.name),
            (&call.id, &call.name),
            "{context}"
        );
        assert!(pieces[1..].iter().all(|d| d.opening.is_none()), "{context}");
        let arguments: String = pieces.iter().map(|d| d.arguments.as_str()).collect();
        assert_eq!(arguments, call.arguments, "{context}");
    }
    assert!(
        deltas.iter().all(|d| (d.index as usize) < calls.len()),
        "{context}"
    );
}

#[test]
fn streamed_pieces_add_up_to_every_syntaxs_calls_at_any_token_split() {
    let cases = [
        (
            tools(ToolChoice::Auto, true),
            "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Zürich \\\"Nord\\\" {1}\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n</tool_call>",
            "Let me check.\n",
            [("get_weather", r#"{"city":"Zürich \"Nord\" {1}"}"#), ("get_time", "{}")].as_slice(),
        ),
        (
            tools_in(CallSyntax::LlamaJson, ToolChoice::Auto, false),
            "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"東京\"}}",
            "",
            &[("get_weather", r#"{"city":"東京"}"#)],
        ),
        (
            tools_in(CallSyntax::Mistral, ToolChoice::Auto, true),
            "Checking. [TOOL_CALLS][{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}, {\"name\": \"get_time\", \"arguments\": {}}]",
            "Checking. ",
            &[("get_weather", r#"{"city":"Oslo"}"#), ("get_time", "{}")],
        ),
        (
            args_tools(false, ToolChoice::Auto, true),
            "Sure. [TOOL_CALLS]get_weather[ARGS]{\"city\": \"Oslo\"}[TOOL_CALLS]get_time[ARGS]{}",
            "Sure. ",
            &[("get_weather", r#"{"city":"Oslo"}"#), ("get_time", "{}")],
        ),
    ];
    for (tools, text, expected_text, expected) in cases {
        let syntax = tools.syntax;
        for step in 1..=9 {
            let context = format!("{syntax:?}, step {step}");
            let (out, calls, deltas) = run_streaming(tools.clone(), text, step);
            assert_eq!(out, expected_text, "{context}");
            let got: Vec<(&str, &str)> = calls
                .iter()
                .map(|c| (c.name.as_str(), c.arguments.as_str()))
                .collect();
            assert_eq!(got, expected, "{context}");
            assert_pieces_make_the_calls(&calls, &deltas, &context);
            // A watcher that does not stream finds the same calls.
            let mut plain = CallWatcher::new(tools.clone(), false, ThinkTags::XML);
            let (plain_out, plain_calls, _) = run(&mut plain, text, step);
            assert_eq!(plain_out, out, "{context}");
            let plain_got: Vec<(&str, &str)> = plain_calls
                .iter()
                .map(|c| (c.name.as_str(), c.arguments.as_str()))
                .collect();
            assert_eq!(plain_got, got, "{context}");
        }
    }
}

#[test]
fn a_calls_opening_comes_once_its_name_is_whole_and_its_arguments_as_written() {
    let mut w = CallWatcher::new(tools(ToolChoice::Auto, true), false, ThinkTags::XML).streaming();
    assert!(w
        .push(b"<tool_call>\n{\"name\": \"get_wea")
        .deltas
        .is_empty());
    let opened = w.push(b"ther\", \"arguments\": {\"ci").deltas;
    let [delta] = opened.as_slice() else {
        panic!("one piece: {opened:?}")
    };
    assert_eq!(delta.index, 0);
    assert_eq!(
        delta.opening.as_ref().map(|o| o.name.as_str()),
        Some("get_weather")
    );
    assert!(delta.opening.as_ref().unwrap().id.starts_with("call_"));
    assert_eq!(delta.arguments, r#"{"ci"#);
    // Whitespace between tokens is no piece; a character split by a token waits.
    let key = w.push(b"ty\"").deltas;
    assert_eq!(key.len(), 1);
    assert_eq!(
        (key[0].opening.is_none(), key[0].arguments.as_str()),
        (true, r#"ty""#)
    );
    assert!(w.push(b" \n ").deltas.is_empty());
    let more = w.push(b":  \"Z\xC3").deltas;
    assert_eq!(more.len(), 1);
    assert_eq!(more[0].arguments, r#":"Z"#);
    let rest = w.push(b"\xBCrich\"}}");
    assert_eq!(rest.deltas[0].arguments, "ürich\"}");
    assert_eq!(rest.calls[0].arguments, r#"{"city":"Zürich"}"#);
}

#[test]
fn a_streamed_call_cut_short_stays_in_pieces_and_an_unnamed_one_comes_back_as_text() {
    // Cut short after its opening went out: the pieces are all there is of it.
    let mut w = CallWatcher::new(tools(ToolChoice::Auto, true), false, ThinkTags::XML).streaming();
    let written = w.push(b"Hi <tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"ci");
    assert_eq!(written.text, b"Hi ");
    assert_eq!(written.deltas.len(), 1);
    assert!(w.finish().is_empty());
    // Cut short before the name was whole: nothing went out, so it is text again.
    let mut w = CallWatcher::new(tools(ToolChoice::Auto, true), false, ThinkTags::XML).streaming();
    let written = w.push(b"Hi <tool_call>\n{\"name\": \"get_w");
    assert!(written.deltas.is_empty());
    assert_eq!(
        String::from_utf8(w.finish()).unwrap(),
        "<tool_call>\n{\"name\": \"get_w"
    );
    // One token that writes a whole call gives its opening and all its arguments
    // before the call itself, under the opening's id.
    let mut w = CallWatcher::new(tools(ToolChoice::Auto, true), false, ThinkTags::XML).streaming();
    let done =
        w.push(b"<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}");
    assert_eq!(done.deltas.len(), 1);
    assert_eq!(done.deltas[0].arguments, r#"{"city":"Oslo"}"#);
    assert_eq!(done.calls.len(), 1);
    assert_eq!(
        done.deltas[0].opening.as_ref().unwrap().id,
        done.calls[0].id
    );
}

#[test]
fn an_args_call_id_written_in_its_header_is_the_streamed_calls_id() {
    let text = "[TOOL_CALLS]get_weather[CALL_ID]a1b2c3d4e[ARGS]{\"city\": \"Oslo\"}";
    for step in 1..=7 {
        let (_, calls, deltas) =
            run_streaming(args_tools(true, ToolChoice::Auto, true), text, step);
        assert_eq!(calls[0].id, "a1b2c3d4e");
        assert_pieces_make_the_calls(&calls, &deltas, &format!("step {step}"));
    }
}
