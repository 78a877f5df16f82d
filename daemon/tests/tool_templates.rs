//! Chats with tools through real models' chat templates: Qwen 3's renders the tools and
//! the calls itself (Hermes tags); SmolLM2's knows nothing of them, so they are
//! described in the system message. Each file that is absent is skipped, and the test
//! says so.

mod support;

use spark_client::protocol::{ToolCall, ToolChatMessage, ToolSpec};
use sparkd::gguf::GgufFile;
use sparkd::text::tools::prompt::TemplateTools;
use sparkd::text::tools::CallSyntax;
use sparkd::text::{ChatTemplate, TemplateVars};
use support::{load_tokenizer, model_path, test_vocab_path, weather_tool, DEFAULT_MODEL};

fn conversation() -> (Vec<ToolChatMessage>, Vec<ToolSpec>) {
    let messages = vec![
        ToolChatMessage::new("user", "Weather in Oslo?"),
        ToolChatMessage {
            role: "assistant".into(),
            content: None,
            tool_calls: vec![ToolCall {
                id: "call_1".into(),
                name: "get_weather".into(),
                arguments: r#"{"city":"Oslo"}"#.into(),
            }],
            tool_call_id: None,
        },
        ToolChatMessage {
            tool_call_id: Some("call_1".into()),
            ..ToolChatMessage::new("tool", "4 C, rain")
        },
    ];
    let tools = vec![weather_tool()];
    (messages, tools)
}

fn render(path: &std::path::Path, show_tools: bool) -> (TemplateTools, String) {
    let file = GgufFile::open(path).expect("open");
    let template = ChatTemplate::from_gguf(file.metadata())
        .expect("template compiles")
        .expect("a template");
    let tok = load_tokenizer(path);
    let (messages, tools) = conversation();
    let text = template
        .render_tool_prompt(
            &messages,
            &tools,
            show_tools,
            &TemplateVars::default(),
            &tok,
        )
        .expect("renders");
    (template.tools(), text)
}

#[test]
fn qwen3_renders_tools_and_calls_in_its_own_syntax() {
    let Some(path) = test_vocab_path("qwen3-vocab.gguf") else {
        eprintln!("skipping: qwen3-vocab.gguf not found (make_vocab_ggufs.py makes it)");
        return;
    };
    let (how, text) = render(&path, true);
    assert_eq!(how, TemplateTools::Native(CallSyntax::Hermes));
    assert!(text.starts_with("<|im_start|>system\n# Tools"), "{text}");
    assert!(
        text.contains(r#"{"type": "function", "function": {"name": "get_weather", "description": "The weather in a city", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}"#),
        "the tool in document order, as json.dumps writes it: {text}"
    );
    assert!(
        text.contains("<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}\n</tool_call>"),
        "{text}"
    );
    assert!(
        text.contains("<tool_response>\n4 C, rain\n</tool_response>"),
        "{text}"
    );
    assert!(text.ends_with("<|im_start|>assistant\n"), "{text}");
    let (_, hidden) = render(&path, false);
    assert!(!hidden.contains("# Tools"), "{hidden}");
    assert!(
        hidden.contains("<tool_call>"),
        "the history's call stays: {hidden}"
    );
}

#[test]
fn smollm2_gets_the_tools_described_in_a_system_message() {
    let Some(path) = model_path(DEFAULT_MODEL) else {
        eprintln!("skipping: {DEFAULT_MODEL} not found");
        return;
    };
    let (how, text) = render(&path, true);
    assert_eq!(how, TemplateTools::Described);
    assert!(text.starts_with("<|im_start|>system\n# Tools"), "{text}");
    assert!(text.contains("<tools>\n{\"type\":\"function\""), "{text}");
    assert!(
        text.contains("<|im_start|>assistant\n<tool_call>\n{\"name\":\"get_weather\",\"arguments\":{\"city\":\"Oslo\"}}\n</tool_call><|im_end|>"),
        "{text}"
    );
    assert!(
        text.contains("<|im_start|>user\n<tool_response>\n4 C, rain\n</tool_response><|im_end|>"),
        "{text}"
    );
}

#[test]
fn mistral_nemo_renders_tools_and_calls_in_its_own_syntax() {
    let Some(path) = test_vocab_path("mistral-nemo-vocab.gguf") else {
        eprintln!("skipping: mistral-nemo-vocab.gguf not found (make_vocab_ggufs.py makes it)");
        return;
    };
    let (how, text) = render(&path, true);
    assert_eq!(how, TemplateTools::Native(CallSyntax::Mistral));
    // The id `call_1` is mapped to nine letters and digits (the template refuses any
    // other), the same in the call and in its result.
    let id = sparkd::text::tools::prompt::mistral_call_id("call_1");
    assert_eq!(
        text,
        format!(
            "[AVAILABLE_TOOLS][{{\"type\": \"function\", \"function\": {{\"name\": \"get_weather\", \"description\": \"The weather in a city\", \"parameters\": {{\"type\": \"object\", \"properties\": {{\"city\": {{\"type\": \"string\"}}}}, \"required\": [\"city\"]}}}}}}][/AVAILABLE_TOOLS]\
             [INST]Weather in Oslo?[/INST]\
             [TOOL_CALLS][{{\"name\": \"get_weather\", \"arguments\": {{\"city\": \"Oslo\"}}, \"id\": \"{id}\"}}]</s>\
             [TOOL_RESULTS]{{\"content\": 4 C, rain, \"call_id\": \"{id}\"}}[/TOOL_RESULTS]"
        )
    );
    let tok = load_tokenizer(&path);
    let calls = tok.token_id("[TOOL_CALLS]").expect("[TOOL_CALLS]");
    assert!(
        tok.encode(&text, false, true).contains(&calls),
        "the prompt's tag is the control token the model writes"
    );
    let (_, hidden) = render(&path, false);
    assert!(!hidden.contains("[AVAILABLE_TOOLS]"), "{hidden}");
    assert!(hidden.contains("[TOOL_CALLS]"), "{hidden}");
}
