//! Reads a tool call's JSON as it is written and finds each call's name and arguments,
//! so the arguments can be streamed while the model is still writing them.
//!
//! The bytes come from the call watcher after its constraint accepted them, so they are
//! always a valid beginning of the syntax's JSON: the scanner only follows structure
//! (nesting, strings, the call object's keys) and never has to recover from bad input.
//!
//! A call's arguments are kept as the model wrote them, less the whitespace between
//! tokens: the same text whether it is read in pieces while it is written or whole when
//! the call closes. (Re-serialising a parsed value instead would rewrite numbers, `1e2`
//! as `100.0`, and round integers past 64 bits, and the pieces already streamed would
//! not add up to it.)

use super::CallSyntax;

/// One call found in the JSON.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ScannedCall {
    /// The tool's name, once its string has closed.
    pub name: Option<String>,
    /// The arguments' text so far, whitespace outside strings left out. Bytes: a token
    /// may end inside a character.
    pub arguments: Vec<u8>,
    /// The arguments' object has closed.
    pub arguments_closed: bool,
    /// The call (its object, or in the `[ARGS]` syntax its arguments) has closed.
    pub closed: bool,
}

/// Where the calls sit in the JSON.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Layout {
    /// One call object, its arguments under `key` (Hermes, Llama).
    Object { key: &'static str },
    /// An array of call objects (Mistral's `[TOOL_CALLS]` list).
    Array { key: &'static str },
    /// The JSON is the arguments themselves; the name came before it (`[ARGS]`).
    Arguments,
}

/// What a string being read is to the scanner.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Role {
    /// A key of the call object.
    Key,
    /// The value of the call object's `name`.
    Name,
    /// Anything else (inside the arguments, or a value the call may carry beside them).
    Other,
}

#[derive(Debug)]
pub struct CallScanner {
    layout: Layout,
    calls: Vec<ScannedCall>,
    /// Containers open.
    depth: u32,
    /// Inside a string (and its role), after a backslash.
    string: Option<Role>,
    escaped: bool,
    /// A key's or name's text with its quotes, read while its string is open.
    raw: Vec<u8>,
    /// At the call object's level: the key whose value comes next, once its `:` is seen.
    key: Option<String>,
    /// At the call object's level: the next string is a key.
    expecting_key: bool,
    /// The depth of the arguments' object while it is being read.
    capturing: Option<u32>,
}

impl CallScanner {
    /// A scanner for `syntax`'s JSON. In the `[ARGS]` syntax the call's `name` came in
    /// its header.
    pub fn new(syntax: CallSyntax, name: Option<String>) -> Self {
        let layout = match syntax {
            CallSyntax::Hermes | CallSyntax::LlamaJson => Layout::Object {
                key: syntax.arguments_key(),
            },
            CallSyntax::Mistral => Layout::Array {
                key: syntax.arguments_key(),
            },
            CallSyntax::MistralArgs { .. } => Layout::Arguments,
        };
        let calls = match layout {
            Layout::Arguments => vec![ScannedCall {
                name,
                ..ScannedCall::default()
            }],
            _ => Vec::new(),
        };
        Self {
            layout,
            calls,
            depth: 0,
            string: None,
            escaped: false,
            raw: Vec::new(),
            key: None,
            expecting_key: false,
            capturing: None,
        }
    }

    /// The calls begun so far, in the order written.
    pub fn calls(&self) -> &[ScannedCall] {
        &self.calls
    }

    /// The calls, once the JSON is complete.
    pub fn into_calls(self) -> Vec<ScannedCall> {
        self.calls
    }

    /// The depth at which the call object's members sit.
    fn call_depth(&self) -> u32 {
        match self.layout {
            Layout::Object { .. } => 1,
            Layout::Array { .. } => 2,
            Layout::Arguments => 0,
        }
    }

    fn arguments_key(&self) -> Option<&'static str> {
        match self.layout {
            Layout::Object { key } | Layout::Array { key } => Some(key),
            Layout::Arguments => None,
        }
    }

    /// Keeps `b` in the arguments when they are being read.
    fn keep(&mut self, b: u8) {
        if self.capturing.is_some() {
            if let Some(call) = self.calls.last_mut() {
                call.arguments.push(b);
            }
        }
    }

    /// Takes one byte the constraint accepted.
    pub fn push(&mut self, b: u8) {
        if let Some(role) = self.string {
            self.string_byte(b, role);
        } else {
            self.structure_byte(b);
        }
    }

    fn string_byte(&mut self, b: u8, role: Role) {
        self.keep(b);
        if role != Role::Other {
            self.raw.push(b);
        }
        if self.escaped {
            self.escaped = false;
            return;
        }
        match b {
            b'\\' => self.escaped = true,
            b'"' => {
                self.string = None;
                let text = serde_json::from_slice::<String>(&std::mem::take(&mut self.raw)).ok();
                match role {
                    Role::Key => {
                        self.key = text;
                        self.expecting_key = false;
                    }
                    Role::Name => {
                        if let Some(call) = self.calls.last_mut() {
                            call.name = text;
                        }
                    }
                    Role::Other => {}
                }
            }
            _ => {}
        }
    }

    fn structure_byte(&mut self, b: u8) {
        let at_call = self.depth == self.call_depth() && self.layout != Layout::Arguments;
        match b {
            b'"' => {
                let role = if !at_call || self.capturing.is_some() {
                    Role::Other
                } else if self.expecting_key {
                    Role::Key
                } else if self.key.as_deref() == Some("name") {
                    Role::Name
                } else {
                    Role::Other
                };
                self.keep(b);
                if role != Role::Other {
                    self.raw.clear();
                    self.raw.push(b);
                }
                self.string = Some(role);
            }
            b'{' | b'[' => {
                let opens_arguments = self.capturing.is_none()
                    && b == b'{'
                    && match self.layout {
                        Layout::Arguments => self.depth == 0,
                        _ => at_call && self.key.as_deref() == self.arguments_key(),
                    };
                if opens_arguments {
                    self.capturing = Some(self.depth + 1);
                }
                self.keep(b);
                self.depth += 1;
                if b == b'{' && self.depth == self.call_depth() && self.layout != Layout::Arguments
                {
                    self.calls.push(ScannedCall::default());
                    self.expecting_key = true;
                    self.key = None;
                }
            }
            b'}' | b']' => {
                self.keep(b);
                if self.capturing == Some(self.depth) {
                    self.capturing = None;
                    if let Some(call) = self.calls.last_mut() {
                        call.arguments_closed = true;
                        if self.layout == Layout::Arguments {
                            call.closed = true;
                        }
                    }
                }
                if self.depth == self.call_depth() && self.layout != Layout::Arguments {
                    if let Some(call) = self.calls.last_mut() {
                        call.closed = true;
                    }
                    self.key = None;
                }
                self.depth = self.depth.saturating_sub(1);
            }
            b',' => {
                self.keep(b);
                if at_call && self.capturing.is_none() {
                    self.expecting_key = true;
                    self.key = None;
                }
            }
            b' ' | b'\t' | b'\n' | b'\r' => {}
            _ => self.keep(b),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scan(syntax: CallSyntax, name: Option<&str>, json: &str) -> Vec<ScannedCall> {
        let mut scanner = CallScanner::new(syntax, name.map(str::to_string));
        for &b in json.as_bytes() {
            scanner.push(b);
        }
        scanner.calls().to_vec()
    }

    fn call(name: &str, arguments: &str) -> ScannedCall {
        ScannedCall {
            name: Some(name.into()),
            arguments: arguments.as_bytes().to_vec(),
            arguments_closed: true,
            closed: true,
        }
    }

    #[test]
    fn a_calls_arguments_are_its_own_text_without_the_whitespace_between_tokens() {
        let json = "{\"name\": \"get_weather\", \"arguments\": {\n  \"city\": \"Oslo Centre\",\n  \"n\": 1e2, \"big\": 123456789012345678901234567890, \"t\": [1, {\"a\": null}]\n}}";
        assert_eq!(
            scan(CallSyntax::Hermes, None, json),
            [call(
                "get_weather",
                r#"{"city":"Oslo Centre","n":1e2,"big":123456789012345678901234567890,"t":[1,{"a":null}]}"#
            )]
        );
    }

    #[test]
    fn strings_keep_their_escapes_braces_commas_and_characters() {
        // The arguments come first here, and strings hold what would be structure.
        let json = r#"{"arguments": {"q": "a \"b\" {c} , [d]: \\", "é": "日本 \u00e9"}, "name": "search"}"#;
        assert_eq!(
            scan(CallSyntax::Hermes, None, json),
            [call(
                "search",
                r#"{"q":"a \"b\" {c} , [d]: \\","é":"日本 \u00e9"}"#
            )]
        );
    }

    #[test]
    fn keys_and_names_are_read_through_their_escapes() {
        let json = r#"{"n\u0061me": "get_\u0074ime", "arguments": {}}"#;
        assert_eq!(
            scan(CallSyntax::Hermes, None, json),
            [call("get_time", "{}")]
        );
    }

    #[test]
    fn llama_calls_keep_their_arguments_under_parameters() {
        let json = r#"{"name": "get_time", "parameters": {"zone": "UTC"}, "arguments": {"x": 1}}"#;
        assert_eq!(
            scan(CallSyntax::LlamaJson, None, json),
            [call("get_time", r#"{"zone":"UTC"}"#)]
        );
    }

    #[test]
    fn a_mistral_list_holds_one_call_per_object() {
        let json = r#"[{"name": "get_weather", "arguments": {"city": "Oslo"}}, {"name": "get_time", "arguments": {}}]"#;
        assert_eq!(
            scan(CallSyntax::Mistral, None, json),
            [
                call("get_weather", r#"{"city":"Oslo"}"#),
                call("get_time", "{}")
            ]
        );
    }

    #[test]
    fn in_the_args_syntax_the_json_is_the_arguments() {
        let json = " {\"city\": \"Oslo\", \"days\": [1, 2]}";
        assert_eq!(
            scan(
                CallSyntax::MistralArgs { call_ids: false },
                Some("get_weather"),
                json
            ),
            [call("get_weather", r#"{"city":"Oslo","days":[1,2]}"#)]
        );
    }

    #[test]
    fn every_prefix_shows_what_has_been_written_so_far() {
        let json = r#"[{"name": "get_weather", "arguments": {"city": "Oslo"}}, {"name": "get_time", "arguments": {}}]"#;
        let whole = scan(CallSyntax::Mistral, None, json);
        let mut scanner = CallScanner::new(CallSyntax::Mistral, None);
        for (at, &b) in json.as_bytes().iter().enumerate() {
            scanner.push(b);
            for (now, end) in scanner.calls().iter().zip(&whole) {
                assert!(end.arguments.starts_with(&now.arguments), "at {at}");
                assert!(now.name.is_none() || now.name == end.name, "at {at}");
                assert!(!now.closed || now.arguments_closed, "at {at}");
            }
        }
        // The first call's name is known before its arguments begin, and the call
        // closes with its object, before the second begins.
        let prefix = r#"[{"name": "get_weather", "#;
        let first = scan(CallSyntax::Mistral, None, prefix);
        assert_eq!(first[0].name.as_deref(), Some("get_weather"));
        assert!(first[0].arguments.is_empty());
        let prefix = r#"[{"name": "get_weather", "arguments": {"city": "Oslo"}}"#;
        let first = scan(CallSyntax::Mistral, None, prefix);
        assert_eq!(first.len(), 1);
        assert!(first[0].closed);
        let prefix = r#"[{"name": "get_weather", "arguments": {"city": "Os"#;
        let first = scan(CallSyntax::Mistral, None, prefix);
        assert_eq!(first[0].arguments, br#"{"city":"Os"#);
        assert!(!first[0].arguments_closed);
    }
}
