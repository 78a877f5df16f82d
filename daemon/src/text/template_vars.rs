//! Extra chat-template variables (`chat_template_kwargs`): the daemon's defaults from
//! `--chat-template-kwargs` and a request's own, checked and merged before rendering.
//!
//! Templates read switches from variables beside the messages: Qwen 3's
//! `enable_thinking`, GPT-OSS's `reasoning_effort`, DeepSeek V3.1's `thinking`. They are
//! data in the template's context, never template code.

use serde_json::{Map, Value};

use super::TextError;

/// Variables the daemon sets itself: a request cannot replace the conversation, the
/// tools or the generation prompt the engine relies on.
pub(crate) const RESERVED: [&str; 6] = [
    "messages",
    "tools",
    "xml_tools",
    "add_generation_prompt",
    "bos_token",
    "eos_token",
];

/// Variables a template sees besides the ones the engine sets.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TemplateVars(Map<String, Value>);

impl TemplateVars {
    /// Parses the text of a JSON object; anything else, or a reserved name, is an error
    /// naming what is wrong.
    pub fn parse(json: &str) -> Result<Self, TextError> {
        let value: Value = serde_json::from_str(json)
            .map_err(|e| TextError::TemplateVariables(format!("not JSON: {e}")))?;
        let Value::Object(map) = value else {
            return Err(TextError::TemplateVariables(
                "must be a JSON object of variable names and values".into(),
            ));
        };
        if let Some(name) = map.keys().find(|k| RESERVED.contains(&k.as_str())) {
            return Err(TextError::TemplateVariables(format!(
                "`{name}` is set by sparkd itself and cannot be given"
            )));
        }
        Ok(Self(map))
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// These variables with `over`'s put on top, name by name.
    pub fn overridden_by(&self, over: &TemplateVars) -> TemplateVars {
        let mut merged = self.0.clone();
        merged.extend(over.0.iter().map(|(k, v)| (k.clone(), v.clone())));
        TemplateVars(merged)
    }

    /// The names, for logs (the values may hold user text and are not logged).
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.0.keys().map(String::as_str)
    }

    pub(super) fn as_map(&self) -> &Map<String, Value> {
        &self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_object_parses_and_other_json_does_not() {
        let vars = TemplateVars::parse(r#"{"enable_thinking": false, "effort": "low"}"#).unwrap();
        let mut names: Vec<_> = vars.names().collect();
        names.sort_unstable();
        assert_eq!(names, ["effort", "enable_thinking"]);
        for bad in ["[1]", "true", "\"x\"", "{", ""] {
            let err = TemplateVars::parse(bad).unwrap_err().to_string();
            assert!(err.contains("chat_template_kwargs"), "{bad}: {err}");
        }
        assert!(TemplateVars::parse("{}").unwrap().is_empty());
    }

    #[test]
    fn reserved_names_are_refused() {
        for name in RESERVED {
            let err = TemplateVars::parse(&format!(r#"{{"{name}": 1}}"#))
                .unwrap_err()
                .to_string();
            assert!(err.contains(name), "{err}");
        }
        // Only exact names: a template's own variable that merely looks alike is fine.
        assert!(TemplateVars::parse(r#"{"tools_in_user_message": false}"#).is_ok());
    }

    #[test]
    fn a_request_overrides_the_defaults_name_by_name() {
        let defaults = TemplateVars::parse(r#"{"enable_thinking": false, "a": 1}"#).unwrap();
        let request = TemplateVars::parse(r#"{"enable_thinking": true, "b": 2}"#).unwrap();
        let merged = defaults.overridden_by(&request);
        assert_eq!(merged.as_map()["enable_thinking"], Value::Bool(true));
        assert_eq!(merged.as_map()["a"], 1);
        assert_eq!(merged.as_map()["b"], 2);
        assert_eq!(defaults.overridden_by(&TemplateVars::default()), defaults);
    }
}
