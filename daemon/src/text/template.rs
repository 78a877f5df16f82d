//! Chat templates: the model's Jinja template (`tokenizer.chat_template`) turning a list of
//! messages into prompt text, rendered with minijinja set up like llama.cpp's and Hugging
//! Face's Jinja (trimmed blocks, Python string methods, `raise_exception`, `tojson`,
//! and what [`super::template_compat`] adds).
//!
//! Messages are passed to the template as data. Their content is never parsed as template
//! code, so a user writing `{{ 7*7 }}` gets those characters, not `49`.

use minijinja::value::{Kwargs, Value, ValueKind};
use minijinja::{Environment, Error, ErrorKind};
use spark_client::protocol::{ChatMessage, ToolCall, ToolChatMessage, ToolSpec};

use super::template_compat::{self as compat, merge_system_messages};
use super::tools::prompt::{template_inputs, TemplateInputs, TemplateTools};
use super::tools::CallSyntax;
use super::{TemplateVars, TextError, Tokenizer};

const NAME: &str = "chat_template";

/// A compiled chat template. Built once at model load; rendering is `&self`.
pub struct ChatTemplate {
    env: Environment<'static>,
    tools: TemplateTools,
    /// Whether the template renders a system message. When it does not (it raises an
    /// error, or drops the text), system messages are merged into the user's.
    system_role: bool,
    /// See [`Self::variables`]: read from the source once, at load.
    variables: Vec<String>,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate")
            .field("tools", &self.tools)
            .field("system_role", &self.system_role)
            .finish_non_exhaustive()
    }
}

impl ChatTemplate {
    /// Compiles `source`. Syntax errors are reported here, not at the first request.
    pub fn new(source: &str) -> Result<Self, TextError> {
        let mut env = Environment::new();
        // llama.cpp's and transformers' chat-template settings.
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        minijinja_contrib::add_to_environment(&mut env);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", raise_exception);
        env.add_filter("tojson", tojson);
        compat::add_to_environment(&mut env);
        env.add_template_owned(NAME, compat::rewrite_generation_blocks(source).into_owned())
            .map_err(|e| TextError::TemplateSyntax(describe(&e)))?;
        let mut template = Self {
            env,
            tools: TemplateTools::of_template(source),
            system_role: true,
            variables: Vec::new(),
        };
        template.variables = template.free_variables();
        template.system_role = template.renders_system_messages();
        if let TemplateTools::Native(
            syntax @ (CallSyntax::Hermes | CallSyntax::Mistral | CallSyntax::MistralArgs { .. }),
        ) = template.tools
        {
            if !template.renders_calls(syntax) {
                template.tools = TemplateTools::Described;
            }
        }
        Ok(template)
    }

    /// Whether the template shows the model the tools it is given and writes a
    /// history's tool call in `syntax`, tried once at load: a template that merely has
    /// the tag may wrap another syntax in it, or read its tools elsewhere.
    fn renders_calls(&self, syntax: CallSyntax) -> bool {
        const NAME: &str = "probe_tool_7f3a";
        const DESCRIPTION: &str = "Probe description 7f3a";
        let call = ToolCall {
            id: "call_probe0000000000000000000".into(),
            name: NAME.into(),
            arguments: r#"{"probe": 1}"#.into(),
        };
        let question = ToolChatMessage::new("user", "User message");
        let history = [
            question.clone(),
            ToolChatMessage {
                role: "assistant".into(),
                content: None,
                tool_calls: vec![call.clone()],
                tool_call_id: None,
            },
            ToolChatMessage {
                tool_call_id: Some(call.id),
                ..ToolChatMessage::new("tool", "Tool result")
            },
        ];
        let tools = [ToolSpec {
            name: NAME.into(),
            description: DESCRIPTION.into(),
            parameters: r#"{"type": "object", "properties": {"probe": {"type": "integer"}}}"#
                .into(),
            strict: false,
        }];
        let render = |messages: &[ToolChatMessage]| {
            self.render_tools(
                messages,
                &tools,
                true,
                &TemplateVars::default(),
                true,
                ("", ""),
            )
        };
        render(&[question]).is_ok_and(|text| text.contains(DESCRIPTION))
            && render(&history).is_ok_and(|text| TemplateTools::writes_calls(syntax, &text, NAME))
    }

    /// Whether the template renders a system message's text, tried once at load as
    /// llama.cpp does. A template that cannot render even a lone user message is left as
    /// it is: its errors are reported at the first request.
    fn renders_system_messages(&self) -> bool {
        const NEEDLE: &str = "<System message 7f3a>";
        let user = serde_json::json!({"role": "user", "content": "User message"});
        let system = serde_json::json!({"role": "system", "content": NEEDLE});
        let none = TemplateVars::default();
        let render = |messages| self.render_values(messages, None, &none, true, ("", ""));
        if render(vec![user.clone()]).is_err() {
            return true;
        }
        render(vec![system, user]).is_ok_and(|text| text.contains(NEEDLE))
    }

    /// The variables the template reads that the daemon does not set, sorted: the
    /// switches a request's `chat_template_kwargs` can set (`enable_thinking`,
    /// `reasoning_effort`, `tools_in_user_message`...), and the dates. A name the
    /// template assigns itself counts only where it also asks whether it is defined
    /// (a default for a caller's value, as GPT-OSS's `reasoning_effort`): minijinja
    /// counts a variable set under a condition (`system_message`, `loop_messages`) as
    /// read from outside too.
    pub fn variables(&self) -> &[String] {
        &self.variables
    }

    fn free_variables(&self) -> Vec<String> {
        let Ok(tmpl) = self.env.get_template(NAME) else {
            return Vec::new();
        };
        let source = tmpl.source();
        let globals: Vec<&str> = self.env.globals().map(|(name, _)| name).collect();
        // `text` in the source as a whole name: not the end of `message.content`, say.
        let has = |text: &str| {
            source.match_indices(text).any(|(at, _)| {
                !source[..at]
                    .chars()
                    .next_back()
                    .is_some_and(|c| c.is_alphanumeric() || c == '_' || c == '.')
            })
        };
        let switch = |name: &str| {
            let assigned = has(&format!("set {name} =")) || has(&format!("set {name}="));
            let asked = ["is defined", "is not defined", "is undefined"]
                .iter()
                .any(|test| has(&format!("{name} {test}")));
            !assigned || asked
        };
        let mut names: Vec<String> = tmpl
            .undeclared_variables(false)
            .into_iter()
            .filter(|name| {
                !super::template_vars::RESERVED.contains(&name.as_str())
                    && !globals.contains(&name.as_str())
                    && switch(name)
            })
            .collect();
        names.sort();
        names
    }

    /// Whether the template renders tools and tool calls itself.
    pub fn tools(&self) -> TemplateTools {
        self.tools
    }

    /// Whether the template renders system messages itself (when not, they are merged
    /// into the user message that follows).
    pub fn system_role(&self) -> bool {
        self.system_role
    }

    /// The template from GGUF metadata (`tokenizer.chat_template`), or `None` when the
    /// file has none.
    pub fn from_gguf(meta: &crate::gguf::Metadata) -> Result<Option<Self>, TextError> {
        meta.opt_str("tokenizer.chat_template")?
            .map(Self::new)
            .transpose()
    }

    /// Renders `messages`. `add_generation_prompt` appends the header of the assistant's
    /// turn; `bos_token`/`eos_token` are the vocabulary's texts for those tokens.
    pub fn render(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
        bos_token: &str,
        eos_token: &str,
    ) -> Result<String, TextError> {
        self.render_values(
            plain_messages(messages),
            None,
            &TemplateVars::default(),
            add_generation_prompt,
            (bos_token, eos_token),
        )
    }

    /// Renders a chat with tools (see [`super::tools::prompt`]) as
    /// [`Self::render_tool_prompt`] does, with the given variables and BOS and EOS texts.
    pub fn render_tools(
        &self,
        messages: &[ToolChatMessage],
        tools: &[ToolSpec],
        show_tools: bool,
        vars: &TemplateVars,
        add_generation_prompt: bool,
        (bos_token, eos_token): (&str, &str),
    ) -> Result<String, TextError> {
        let TemplateInputs { messages, tools } =
            template_inputs(self.tools, messages, tools, show_tools);
        self.render_values(
            messages,
            tools,
            vars,
            add_generation_prompt,
            (bos_token, eos_token),
        )
    }

    fn render_values(
        &self,
        mut messages: Vec<serde_json::Value>,
        tools: Option<Vec<serde_json::Value>>,
        vars: &TemplateVars,
        add_generation_prompt: bool,
        (bos_token, eos_token): (&str, &str),
    ) -> Result<String, TextError> {
        if !self.system_role {
            merge_system_messages(&mut messages);
        }
        let tmpl = self
            .env
            .get_template(NAME)
            .map_err(|e| TextError::TemplateRender(describe(&e)))?;
        let (datetime, date_string) = compat::dates(&chrono::Local::now());
        let engine_vars = minijinja::context! {
            messages => Value::from_serialize(&messages),
            // SmolLM3's template reads its tools from `xml_tools`.
            xml_tools => tools.as_ref().map(Value::from_serialize),
            tools => tools.map(|t| Value::from_serialize(&t)),
            add_generation_prompt => add_generation_prompt,
            bos_token => bos_token,
            eos_token => eos_token,
        };
        // Later maps win: the caller's variables may set the dates, not the engine's own.
        let ctx = minijinja::value::merge_maps([
            minijinja::context! { datetime => datetime, date_string => date_string },
            Value::from_serialize(vars.as_map()),
            engine_vars,
        ]);
        tmpl.render(ctx)
            .map_err(|e| TextError::TemplateRender(describe(&e)))
    }

    /// The prompt for a chat request, as llama.cpp's server builds it: generation prompt
    /// added, and a leading BOS text removed when the tokenizer adds BOS itself (so the
    /// prompt does not start with two). `vars` are the template's extra variables.
    pub fn render_prompt(
        &self,
        messages: &[ChatMessage],
        vars: &TemplateVars,
        tokenizer: &Tokenizer,
    ) -> Result<String, TextError> {
        self.prompt_of(plain_messages(messages), None, vars, tokenizer)
    }

    /// The prompt for a chat with tools (see [`super::tools::prompt`]); `show_tools`
    /// false renders the history's calls without offering the tools.
    pub fn render_tool_prompt(
        &self,
        messages: &[ToolChatMessage],
        tools: &[ToolSpec],
        show_tools: bool,
        vars: &TemplateVars,
        tokenizer: &Tokenizer,
    ) -> Result<String, TextError> {
        let TemplateInputs { messages, tools } =
            template_inputs(self.tools, messages, tools, show_tools);
        self.prompt_of(messages, tools, vars, tokenizer)
    }

    fn prompt_of(
        &self,
        messages: Vec<serde_json::Value>,
        tools: Option<Vec<serde_json::Value>>,
        vars: &TemplateVars,
        tokenizer: &Tokenizer,
    ) -> Result<String, TextError> {
        let text_of = |id: Option<u32>| id.and_then(|id| tokenizer.token_text(id)).unwrap_or("");
        let bos = text_of(tokenizer.bos());
        let mut prompt =
            self.render_values(messages, tools, vars, true, (bos, text_of(tokenizer.eos())))?;
        if tokenizer.add_bos() && !bos.is_empty() && prompt.starts_with(bos) {
            prompt.drain(..bos.len());
        }
        Ok(prompt)
    }
}

/// Messages as `{role, content}` objects.
fn plain_messages(messages: &[ChatMessage]) -> Vec<serde_json::Value> {
    messages
        .iter()
        .map(|m| serde_json::json!({"role": m.role, "content": m.content}))
        .collect()
}

/// minijinja's message plus the chain of causes (where in the template it failed).
fn describe(e: &Error) -> String {
    let mut msg = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        msg.push_str(": ");
        msg.push_str(&s.to_string());
        source = s.source();
    }
    msg
}

/// Templates call this to reject input they cannot render (e.g. roles out of order).
fn raise_exception(message: String) -> Result<Value, Error> {
    Err(Error::new(
        ErrorKind::InvalidOperation,
        format!("template raised: {message}"),
    ))
}

/// `tojson` as transformers defines it for chat templates: Python's `json.dumps` with
/// `ensure_ascii=False` (non-ASCII kept, no HTML escaping), `", "`/`": "` separators, and
/// optional `indent`, `ensure_ascii` and `sort_keys`.
fn tojson(value: &Value, kwargs: Kwargs) -> Result<Value, Error> {
    let style = JsonStyle {
        indent: kwargs.get("indent")?,
        ensure_ascii: kwargs.get::<Option<bool>>("ensure_ascii")?.unwrap_or(false),
        sort_keys: kwargs.get::<Option<bool>>("sort_keys")?.unwrap_or(false),
    };
    kwargs.assert_all_used()?;
    let mut out = String::new();
    write_json(value, &style, 0, &mut out)?;
    Ok(Value::from_safe_string(out))
}

/// `json.dumps`' options that templates pass.
struct JsonStyle {
    indent: Option<usize>,
    /// Non-ASCII characters written as `\uXXXX` escapes (surrogate pairs past U+FFFF).
    ensure_ascii: bool,
    /// Object keys in sorted order rather than as written.
    sort_keys: bool,
}

fn write_json(v: &Value, style: &JsonStyle, depth: usize, out: &mut String) -> Result<(), Error> {
    let newline = |out: &mut String, depth: usize| {
        if let Some(n) = style.indent {
            out.push('\n');
            out.extend(std::iter::repeat_n(' ', n * depth));
        }
    };
    let item_sep = if style.indent.is_some() { "," } else { ", " };
    match v.kind() {
        ValueKind::Undefined | ValueKind::None => out.push_str("null"),
        ValueKind::Bool => out.push_str(if v.is_true() { "true" } else { "false" }),
        ValueKind::Number => out.push_str(&v.to_string()),
        ValueKind::String => write_json_string(v.as_str().unwrap_or_default(), style, out),
        ValueKind::Seq | ValueKind::Iterable => {
            let items: Vec<Value> = v.try_iter()?.collect();
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(item_sep);
                }
                newline(out, depth + 1);
                write_json(item, style, depth + 1, out)?;
            }
            if !items.is_empty() {
                newline(out, depth);
            }
            out.push(']');
        }
        ValueKind::Map => {
            let mut keys: Vec<Value> = v.try_iter()?.collect();
            if style.sort_keys {
                keys.sort_by_key(|k| k.to_string());
            }
            out.push('{');
            for (i, key) in keys.iter().enumerate() {
                if i > 0 {
                    out.push_str(item_sep);
                }
                newline(out, depth + 1);
                write_json_string(&key.to_string(), style, out);
                out.push_str(": ");
                write_json(&v.get_item(key)?, style, depth + 1, out)?;
            }
            if !keys.is_empty() {
                newline(out, depth);
            }
            out.push('}');
        }
        _ => {
            return Err(Error::new(
                ErrorKind::InvalidOperation,
                format!("cannot convert {} to JSON", v.kind()),
            ))
        }
    }
    Ok(())
}

fn write_json_string(s: &str, style: &JsonStyle, out: &mut String) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{08}' => out.push_str("\\b"),
            '\u{0C}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c if style.ensure_ascii && !c.is_ascii() => {
                let mut units = [0u16; 2];
                for unit in c.encode_utf16(&mut units) {
                    out.push_str(&format!("\\u{unit:04x}"));
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

#[cfg(test)]
mod tests {
    use super::*;

    const CHATML: &str = "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

    fn msgs(pairs: &[(&str, &str)]) -> Vec<ChatMessage> {
        pairs
            .iter()
            .map(|(r, c)| ChatMessage::new(*r, *c))
            .collect()
    }

    #[test]
    fn renders_chatml() {
        let t = ChatTemplate::new(CHATML).unwrap();
        let out = t.render(&msgs(&[("user", "Hi")]), true, "", "").unwrap();
        assert_eq!(
            out,
            "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
        );
        let out = t.render(&msgs(&[("user", "Hi")]), false, "", "").unwrap();
        assert_eq!(out, "<|im_start|>user\nHi<|im_end|>\n");
    }

    /// Renders one user message `Hi` with `vars` (JSON) and the generation prompt.
    fn render_with_vars(source: &str, vars: &str) -> String {
        let t = ChatTemplate::new(source).unwrap();
        let vars = TemplateVars::parse(vars).unwrap();
        t.render_values(
            plain_messages(&msgs(&[("user", "Hi")])),
            None,
            &vars,
            true,
            ("", ""),
        )
        .unwrap()
    }

    #[test]
    fn template_variables_reach_the_template() {
        // Qwen 3's switch, as its template writes it.
        let qwen3 = "{{ messages[0]['content'] }}|{%- if add_generation_prompt %}{{- 'A:' }}{%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\n\n</think>\n\n' }}{%- endif %}{%- endif %}";
        assert_eq!(render_with_vars(qwen3, "{}"), "Hi|A:");
        assert_eq!(
            render_with_vars(qwen3, r#"{"enable_thinking": false}"#),
            "Hi|A:<think>\n\n</think>\n\n"
        );
        assert_eq!(
            render_with_vars(qwen3, r#"{"enable_thinking": true}"#),
            "Hi|A:"
        );
        // Any JSON value, nested ones too.
        let effort = "{{ reasoning_effort }} {{ opts.level }} {{ opts.tags | join(',') }}";
        assert_eq!(
            render_with_vars(
                effort,
                r#"{"reasoning_effort": "low", "opts": {"level": 2, "tags": ["a", "b"]}}"#
            ),
            "low 2 a,b"
        );
    }

    #[test]
    fn template_variables_are_data_and_may_set_the_date() {
        let t = "{{ note }} / {{ date_string }}";
        assert_eq!(
            render_with_vars(t, r#"{"note": "{{ 7*7 }}", "date_string": "01 Jan 2030"}"#),
            "{{ 7*7 }} / 01 Jan 2030"
        );
        // Without one, today's date as llama.cpp writes it.
        let today = chrono::Local::now().format("%d %b %Y").to_string();
        assert_eq!(render_with_vars("{{ date_string }}", "{}"), today);
    }

    #[test]
    fn message_content_is_data_not_code() {
        let t = ChatTemplate::new(CHATML).unwrap();
        let content = "{{ 7*7 }} {% raw %}{% endraw %} {# no #} {{ raise_exception('x') }}";
        let out = t
            .render(&msgs(&[("user", content)]), false, "", "")
            .unwrap();
        assert_eq!(out, format!("<|im_start|>user\n{content}<|im_end|>\n"));
    }

    #[test]
    fn syntax_and_render_errors_are_reported() {
        let err = ChatTemplate::new("{% for m in messages %}").unwrap_err();
        assert!(matches!(err, TextError::TemplateSyntax(_)), "{err}");
        let t = ChatTemplate::new(
            "{% if messages[0]['role'] != 'system' %}{{ raise_exception('System first, please') }}{% endif %}ok",
        )
        .unwrap();
        let err = t.render(&msgs(&[("user", "x")]), true, "", "").unwrap_err();
        assert!(
            matches!(&err, TextError::TemplateRender(m) if m.contains("System first, please")),
            "{err}"
        );
        assert_eq!(
            t.render(&msgs(&[("system", "x")]), true, "", "").unwrap(),
            "ok"
        );
    }

    #[test]
    fn python_string_methods_and_loop_controls() {
        let src = "{% for m in messages %}{% if m.role == 'skip' %}{% continue %}{% endif %}{{ m.content.strip().upper() }}{% if m.content.startswith(' a') %}!{% endif %}{% endfor %}";
        let t = ChatTemplate::new(src).unwrap();
        let out = t
            .render(
                &msgs(&[("user", " abc "), ("skip", "no"), ("user", "d")]),
                true,
                "",
                "",
            )
            .unwrap();
        assert_eq!(out, "ABC!D");
    }

    #[test]
    fn blocks_are_trimmed_like_llama_cpp() {
        let src = "{% for m in messages %}\n    {% if true %}\n{{ m.content }}\n    {% endif %}\n{% endfor %}";
        let t = ChatTemplate::new(src).unwrap();
        assert_eq!(
            t.render(&msgs(&[("user", "a"), ("user", "b")]), true, "", "")
                .unwrap(),
            "a\nb\n"
        );
    }

    #[test]
    fn tojson_matches_python_json_dumps() {
        let t = ChatTemplate::new(
            "{{ messages | tojson }}|{{ {'a': [1, 2.5, none, true]} | tojson(indent=2) }}",
        )
        .unwrap();
        let out = t
            .render(&msgs(&[("user", "é \"q\"\n<b>")]), true, "", "")
            .unwrap();
        assert_eq!(
            out,
            "[{\"role\": \"user\", \"content\": \"é \\\"q\\\"\\n<b>\"}]|{\n  \"a\": [\n    1,\n    2.5,\n    null,\n    true\n  ]\n}"
        );
    }

    /// A template in the Hermes style whose calls are written by `CALL`, and whose
    /// tools come from `TOOLS_VAR`.
    fn hermes_like(tools_var: &str, call: &str) -> ChatTemplate {
        ChatTemplate::new(&format!(
            "{{% if {tools_var} %}}<tools>{{% for t in {tools_var} %}}{{{{ t | tojson }}}}{{% endfor %}}</tools>{{% endif %}}\
             {{% for m in messages %}}{{% if m.tool_calls %}}{{% for c in m.tool_calls %}}<tool_call>{call}</tool_call>{{% endfor %}}\
             {{% else %}}{{{{ m.role }}}}: {{{{ m.content }}}}\n{{% endif %}}{{% endfor %}}"
        ))
        .unwrap()
    }

    #[test]
    fn only_templates_that_write_hermes_json_calls_are_read_as_hermes() {
        let json_call =
            "{{ {'name': c.function.name, 'arguments': c.function.arguments} | tojson }}";
        let native = TemplateTools::Native(CallSyntax::Hermes);
        assert_eq!(hermes_like("tools", json_call).tools(), native);
        // SmolLM3's template takes its tools as `xml_tools`.
        assert_eq!(hermes_like("xml_tools", json_call).tools(), native);
        // Qwen3-Coder's wraps XML parameters in the tag.
        let xml_call = "<function={{ c.function.name }}><parameter=probe>1</parameter></function>";
        assert_eq!(
            hermes_like("tools", xml_call).tools(),
            TemplateTools::Described
        );
        // Tools read from a variable nobody passes are never shown to the model.
        assert_eq!(
            hermes_like("functions", json_call).tools(),
            TemplateTools::Described
        );
    }

    #[test]
    fn a_template_without_a_system_role_gets_the_system_text_in_the_user_turn() {
        let t = ChatTemplate::new(
            "{% for m in messages %}{% if m.role == 'system' %}{{ raise_exception('System role not supported') }}{% endif %}<{{ m.role }}>{{ m.content }}{% endfor %}",
        )
        .unwrap();
        assert!(!t.system_role());
        let out = t
            .render(
                &msgs(&[("system", "Be brief."), ("user", "Hi")]),
                false,
                "",
                "",
            )
            .unwrap();
        assert_eq!(out, "<user>Be brief.\nHi");
        assert!(ChatTemplate::new(CHATML).unwrap().system_role());
    }

    #[test]
    fn tojson_ensure_ascii_and_sort_keys_follow_python() {
        let t = ChatTemplate::new(
            "{{ {'b': 'é😀', 'a': 1} | tojson(ensure_ascii=True) }}|{{ {'b': 2, 'a': 1} | tojson(sort_keys=True) }}",
        )
        .unwrap();
        // json.dumps({'b': 'é😀', 'a': 1}, ensure_ascii=True) and sort_keys=True.
        assert_eq!(
            t.render(&msgs(&[("user", "x")]), true, "", "").unwrap(),
            "{\"b\": \"\\u00e9\\ud83d\\ude00\", \"a\": 1}|{\"a\": 1, \"b\": 2}"
        );
    }

    #[test]
    fn bos_and_eos_are_available() {
        let t =
            ChatTemplate::new("{{ bos_token }}{{ messages[0].content }}{{ eos_token }}").unwrap();
        assert_eq!(
            t.render(&msgs(&[("user", "x")]), true, "<s>", "</s>")
                .unwrap(),
            "<s>x</s>"
        );
    }
}

#[cfg(test)]
#[path = "template_injection_tests.rs"]
mod injection_tests;
