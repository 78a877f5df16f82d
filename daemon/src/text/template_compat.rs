//! What real chat templates expect of their Jinja beyond minijinja's defaults: the
//! helpers Hugging Face's `apply_chat_template` and llama.cpp give them, and Python
//! Jinja's behaviour where minijinja's differs. Each was found by rendering the chat
//! templates llama.cpp tests against (see `tests/chat_template_corpus.rs`).

use std::borrow::Cow;
use std::fmt::Write;

use chrono::format::{Item, StrftimeItems};
use chrono::{DateTime, Local, TimeZone};
use minijinja::value::{Value, ValueKind};
use minijinja::{Environment, Error, ErrorKind};

/// Registers `strftime_now` and Python's `iterable` test.
pub fn add_to_environment(env: &mut Environment<'_>) {
    env.add_function("strftime_now", strftime_now);
    env.add_test("iterable", is_iterable);
}

/// transformers marks the assistant's part of a template with `{% generation %}` ...
/// `{% endgeneration %}` (for training masks); its body renders unchanged. minijinja has
/// no such tag, so the pair becomes `{% if true %}` ... `{% endif %}`, keeping the
/// whitespace-control markers and so the output.
pub fn rewrite_generation_blocks(source: &str) -> Cow<'_, str> {
    if !source.contains("generation") {
        return Cow::Borrowed(source);
    }
    let tag = fancy_regex::Regex::new(r"\{%([-+]?)\s*(end)?generation\s*([-+]?)%\}")
        .expect("a valid expression");
    tag.replace_all(source, |caps: &fancy_regex::Captures<'_>| {
        let statement = if caps.get(2).is_some() {
            "endif"
        } else {
            "if true"
        };
        format!("{{%{} {statement} {}%}}", &caps[1], &caps[3])
    })
}

/// `datetime` and `date_string`, which llama.cpp gives every template: today's date
/// rather than the fixed 2024 date Llama 3.1's template falls back on.
pub fn dates<Tz: TimeZone>(now: &DateTime<Tz>) -> (String, String)
where
    Tz::Offset: std::fmt::Display,
{
    (
        now.format("%b %d %Y").to_string(),
        now.format("%d %b %Y").to_string(),
    )
}

/// transformers' `strftime_now(format)`: the local time in Python's strftime
/// directives (Mistral's and Granite's templates write today's date into the prompt).
fn strftime_now(format: &str) -> Result<String, Error> {
    format_time(&Local::now(), format)
}

fn format_time<Tz: TimeZone>(time: &DateTime<Tz>, format: &str) -> Result<String, Error>
where
    Tz::Offset: std::fmt::Display,
{
    // The format comes from the model file: an unknown directive is an error here, not
    // the panic chrono's `to_string` would raise.
    let items: Vec<Item<'_>> = StrftimeItems::new(format).collect();
    if items.iter().any(|item| matches!(item, Item::Error)) {
        return Err(Error::new(
            ErrorKind::InvalidOperation,
            format!("strftime_now: unsupported format {format:?}"),
        ));
    }
    let mut out = String::new();
    write!(out, "{}", time.format_with_items(items.into_iter())).map_err(|_| {
        Error::new(
            ErrorKind::InvalidOperation,
            format!("strftime_now: cannot format the time as {format:?}"),
        )
    })?;
    Ok(out)
}

/// Python Jinja's `iterable`: whatever `iter()` takes, strings and undefined included,
/// but not `none`. minijinja counts `none` as iterable, which breaks the common guard
/// `tools is iterable and tools | length > 0` when no tools are given.
fn is_iterable(value: &Value) -> bool {
    matches!(
        value.kind(),
        ValueKind::Seq
            | ValueKind::Map
            | ValueKind::Iterable
            | ValueKind::String
            | ValueKind::Undefined
    )
}

/// For templates without a system role (Gemma's raise an error on one): each system
/// message is put in front of the user message that follows it, as llama.cpp does. A
/// system message with no user message right after it is left for the template to
/// refuse, so nothing the caller wrote is dropped.
pub fn merge_system_messages(messages: &mut Vec<serde_json::Value>) {
    let is =
        |m: &serde_json::Value, role: &str| m.get("role").and_then(|r| r.as_str()) == Some(role);
    let mut i = 0;
    while i + 1 < messages.len() {
        if is(&messages[i], "system") && is(&messages[i + 1], "user") {
            let system = messages.remove(i);
            let system = system.get("content").and_then(|c| c.as_str()).unwrap_or("");
            let user = &mut messages[i];
            let content = user.get("content").and_then(|c| c.as_str()).unwrap_or("");
            let merged = if content.is_empty() {
                system.to_string()
            } else {
                format!("{system}\n{content}")
            };
            user["content"] = serde_json::Value::String(merged);
        } else {
            i += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::{TimeZone, Utc};
    use serde_json::json;

    fn env_with(source: &str) -> Environment<'static> {
        let mut env = Environment::new();
        add_to_environment(&mut env);
        env.add_template_owned("t", source.to_string()).unwrap();
        env
    }

    #[test]
    fn generation_blocks_render_their_body_with_the_same_whitespace() {
        let source = "a{%- generation -%}\n  b  \n{%- endgeneration %}c{% generation %}d{%+ endgeneration +%}";
        let rewritten = rewrite_generation_blocks(source);
        assert_eq!(
            rewritten,
            "a{%- if true -%}\n  b  \n{%- endif %}c{% if true %}d{%+ endif +%}"
        );
        let env = env_with(&rewritten);
        assert_eq!(env.get_template("t").unwrap().render(()).unwrap(), "abcd");
        assert!(matches!(
            rewrite_generation_blocks("{{ add_generation_prompt }}"),
            Cow::Borrowed(_)
        ));
        assert_eq!(
            rewrite_generation_blocks("{% if add_generation_prompt %}x{% endif %}"),
            "{% if add_generation_prompt %}x{% endif %}"
        );
    }

    #[test]
    fn strftime_follows_python_directives_and_refuses_unknown_ones() {
        let t = Utc.with_ymd_and_hms(2026, 3, 7, 14, 5, 9).unwrap();
        assert_eq!(format_time(&t, "%Y-%m-%d").unwrap(), "2026-03-07");
        assert_eq!(
            format_time(&t, "%d %B %Y, %A %H:%M:%S %%").unwrap(),
            "07 March 2026, Saturday 14:05:09 %"
        );
        assert_eq!(dates(&t), ("Mar 07 2026".into(), "07 Mar 2026".into()));
        let err = format_time(&t, "%Y %Q").unwrap_err();
        assert!(err.to_string().contains("unsupported format"), "{err}");
        let env = env_with("{{ strftime_now('%Y')|length }}");
        assert_eq!(env.get_template("t").unwrap().render(()).unwrap(), "4");
    }

    #[test]
    fn none_is_not_iterable_as_in_python() {
        let env = env_with(
            "{% if tools is iterable and tools | length > 0 %}{{ tools | length }}{% else %}no{% endif %}",
        );
        let t = env.get_template("t").unwrap();
        let none: Option<Vec<u8>> = None;
        assert_eq!(
            t.render(minijinja::context! { tools => none }).unwrap(),
            "no"
        );
        assert_eq!(
            t.render(minijinja::context! { tools => vec![1, 2] })
                .unwrap(),
            "2"
        );
        assert_eq!(
            t.render(minijinja::context! { tools => Vec::<u8>::new() })
                .unwrap(),
            "no"
        );
        let env = env_with("{{ 'ab' is iterable }} {{ 3 is iterable }} {{ {} is iterable }}");
        assert_eq!(
            env.get_template("t").unwrap().render(()).unwrap(),
            "True False True"
        );
    }

    #[test]
    fn system_messages_go_in_front_of_the_next_user_message() {
        let mut messages = vec![
            json!({"role": "system", "content": "Be brief."}),
            json!({"role": "user", "content": "Hi"}),
            json!({"role": "assistant", "content": "Hello"}),
            json!({"role": "system", "content": "Now in French."}),
            json!({"role": "user", "content": ""}),
            json!({"role": "system", "content": "left alone"}),
        ];
        merge_system_messages(&mut messages);
        assert_eq!(
            messages,
            vec![
                json!({"role": "user", "content": "Be brief.\nHi"}),
                json!({"role": "assistant", "content": "Hello"}),
                json!({"role": "user", "content": "Now in French."}),
                json!({"role": "system", "content": "left alone"}),
            ]
        );
    }
}
