//! The key-value metadata of a GGUF file, with typed getters that turn a missing or
//! mistyped key into an error naming the key.

use std::collections::HashMap;

use super::error::GgufError;
use super::value::Value;

/// Metadata in file order, with a hash index for lookups.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Metadata {
    entries: Vec<(String, Value)>,
    index: HashMap<String, usize>,
}

impl Metadata {
    pub fn new() -> Self {
        Self::default()
    }

    pub(crate) fn with_capacity(n: usize) -> Self {
        Self {
            entries: Vec::with_capacity(n),
            index: HashMap::with_capacity(n),
        }
    }

    /// Sets `key`. A new key goes to the end; an existing key keeps its position and
    /// gets the new value, which is returned with the old one.
    pub fn insert(&mut self, key: impl Into<String>, value: Value) -> Option<Value> {
        let key = key.into();
        if let Some(&i) = self.index.get(&key) {
            return Some(std::mem::replace(&mut self.entries[i].1, value));
        }
        self.index.insert(key.clone(), self.entries.len());
        self.entries.push((key, value));
        None
    }

    pub fn get(&self, key: &str) -> Option<&Value> {
        self.index.get(key).map(|&i| &self.entries[i].1)
    }

    pub fn contains_key(&self, key: &str) -> bool {
        self.index.contains_key(key)
    }

    /// Entries in file (or insertion) order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &Value)> {
        self.entries.iter().map(|(k, v)| (k.as_str(), v))
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    fn require(&self, key: &str) -> Result<&Value, GgufError> {
        self.get(key).ok_or_else(|| GgufError::MissingKey {
            key: key.to_owned(),
        })
    }

    pub fn get_str(&self, key: &str) -> Result<&str, GgufError> {
        to_str(key, self.require(key)?)
    }

    /// Any integer type whose value fits: converters write counts as u32, i32 or u64
    /// depending on their version, and all of them mean the same number.
    pub fn get_u32(&self, key: &str) -> Result<u32, GgufError> {
        to_int(key, self.require(key)?, "u32")
    }

    /// Any integer type whose value fits.
    pub fn get_u64(&self, key: &str) -> Result<u64, GgufError> {
        to_int(key, self.require(key)?, "u64")
    }

    /// f32, f64 (when within the f32 range) or any integer.
    pub fn get_f32(&self, key: &str) -> Result<f32, GgufError> {
        to_f32(key, self.require(key)?)
    }

    pub fn get_bool(&self, key: &str) -> Result<bool, GgufError> {
        match self.require(key)? {
            Value::Bool(b) => Ok(*b),
            other => Err(wrong_type(key, "bool", other.type_name())),
        }
    }

    pub fn get_array(&self, key: &str) -> Result<&[Value], GgufError> {
        to_array(key, self.require(key)?, "array")
    }

    pub fn get_str_array(&self, key: &str) -> Result<Vec<&str>, GgufError> {
        self.convert_array(key, "array of string", to_str)
    }

    /// Elements may be f32, f64 or integers, as for [`get_f32`](Self::get_f32).
    pub fn get_f32_array(&self, key: &str) -> Result<Vec<f32>, GgufError> {
        self.convert_array(key, "array of f32", to_f32)
    }

    /// Elements may be any integer type whose values fit in i32.
    pub fn get_i32_array(&self, key: &str) -> Result<Vec<i32>, GgufError> {
        self.convert_array(key, "array of i32", |k, v| to_int(k, v, "i32"))
    }

    pub fn opt_str(&self, key: &str) -> Result<Option<&str>, GgufError> {
        self.optional(key, Self::get_str)
    }

    pub fn opt_u32(&self, key: &str) -> Result<Option<u32>, GgufError> {
        self.optional(key, Self::get_u32)
    }

    pub fn opt_u64(&self, key: &str) -> Result<Option<u64>, GgufError> {
        self.optional(key, Self::get_u64)
    }

    pub fn opt_f32(&self, key: &str) -> Result<Option<f32>, GgufError> {
        self.optional(key, Self::get_f32)
    }

    pub fn opt_bool(&self, key: &str) -> Result<Option<bool>, GgufError> {
        self.optional(key, Self::get_bool)
    }

    fn optional<'a, T>(
        &'a self,
        key: &str,
        get: impl FnOnce(&'a Self, &str) -> Result<T, GgufError>,
    ) -> Result<Option<T>, GgufError> {
        if self.contains_key(key) {
            get(self, key).map(Some)
        } else {
            Ok(None)
        }
    }

    /// Converts every element with `conv`; an element of the wrong type is reported as
    /// the whole array having the wrong type ("array of i32", not "i32").
    fn convert_array<'a, T>(
        &'a self,
        key: &str,
        expected: &'static str,
        conv: impl Fn(&str, &'a Value) -> Result<T, GgufError>,
    ) -> Result<Vec<T>, GgufError> {
        let items = to_array(key, self.require(key)?, expected)?;
        items
            .iter()
            .map(|v| {
                conv(key, v).map_err(|e| match e {
                    GgufError::WrongType { .. } => {
                        wrong_type(key, expected, v.value_type().array_of_name())
                    }
                    other => other,
                })
            })
            .collect()
    }
}

fn wrong_type(key: &str, expected: &'static str, found: &'static str) -> GgufError {
    GgufError::WrongType {
        key: key.to_owned(),
        expected,
        found,
    }
}

fn to_str<'a>(key: &str, v: &'a Value) -> Result<&'a str, GgufError> {
    v.as_str()
        .ok_or_else(|| wrong_type(key, "string", v.type_name()))
}

fn to_array<'a>(key: &str, v: &'a Value, expected: &'static str) -> Result<&'a [Value], GgufError> {
    v.as_array()
        .ok_or_else(|| wrong_type(key, expected, v.type_name()))
}

fn to_int<T: TryFrom<i128>>(key: &str, v: &Value, target: &'static str) -> Result<T, GgufError> {
    let n = v
        .as_i128()
        .ok_or_else(|| wrong_type(key, target, v.type_name()))?;
    T::try_from(n).map_err(|_| GgufError::OutOfRange {
        key: key.to_owned(),
        value: n.to_string(),
        target,
    })
}

fn to_f32(key: &str, v: &Value) -> Result<f32, GgufError> {
    if let Value::F32(x) = v {
        return Ok(*x);
    }
    let x = v
        .as_f64()
        .ok_or_else(|| wrong_type(key, "f32", v.type_name()))?;
    // Infinities and NaN carry over; a finite f64 beyond the f32 range would silently
    // become infinite, which is never what a hyperparameter means.
    if x.is_finite() && x.abs() > f64::from(f32::MAX) {
        return Err(GgufError::OutOfRange {
            key: key.to_owned(),
            value: x.to_string(),
            target: "f32",
        });
    }
    Ok(x as f32)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Metadata {
        let mut m = Metadata::new();
        m.insert("a.str", "hello".into());
        m.insert("a.u32", Value::U32(7));
        m.insert("a.i32", Value::I32(9));
        m.insert("a.neg", Value::I32(-1));
        m.insert("a.u64big", Value::U64(1 << 40));
        m.insert("a.f64", Value::F64(0.25));
        m.insert("a.f64huge", Value::F64(1e300));
        m.insert("a.bool", Value::Bool(true));
        m.insert("a.strs", vec!["x", "y"].into());
        m.insert("a.f32s", Value::Array(vec![Value::F32(1.5), Value::I8(-2)]));
        m.insert("a.i32s", vec![1i32, -2, 3].into());
        m.insert("a.mixed", Value::Array(vec![Value::U8(1)]));
        m
    }

    #[test]
    fn insertion_order_and_replace_in_place() {
        let mut m = sample();
        let keys: Vec<_> = m.iter().map(|(k, _)| k.to_owned()).collect();
        assert_eq!(keys.first().map(String::as_str), Some("a.str"));
        assert_eq!(keys.last().map(String::as_str), Some("a.mixed"));
        let old = m.insert("a.str", "bye".into());
        assert_eq!(old, Some(Value::String("hello".into())));
        assert_eq!(
            m.iter().next(),
            Some(("a.str", &Value::String("bye".into())))
        );
        assert_eq!(m.len(), keys.len());
    }

    #[test]
    fn integer_getters_accept_any_fitting_integer() {
        let m = sample();
        assert_eq!(m.get_u32("a.u32").ok(), Some(7));
        assert_eq!(m.get_u32("a.i32").ok(), Some(9));
        assert_eq!(m.get_u64("a.u64big").ok(), Some(1 << 40));
        assert!(matches!(
            m.get_u32("a.u64big"),
            Err(GgufError::OutOfRange { target: "u32", .. })
        ));
        assert!(matches!(
            m.get_u64("a.neg"),
            Err(GgufError::OutOfRange { .. })
        ));
        assert!(matches!(
            m.get_u32("a.str"),
            Err(GgufError::WrongType {
                expected: "u32",
                found: "string",
                ..
            })
        ));
    }

    #[test]
    fn float_getter_widens_and_range_checks() {
        let m = sample();
        assert_eq!(m.get_f32("a.f64").ok(), Some(0.25));
        assert_eq!(m.get_f32("a.u32").ok(), Some(7.0));
        assert!(matches!(
            m.get_f32("a.f64huge"),
            Err(GgufError::OutOfRange { .. })
        ));
        assert!(matches!(
            m.get_f32("a.bool"),
            Err(GgufError::WrongType { found: "bool", .. })
        ));
    }

    #[test]
    fn missing_and_optional() {
        let m = sample();
        match m.get_str("nope") {
            Err(GgufError::MissingKey { key }) => assert_eq!(key, "nope"),
            other => panic!("expected MissingKey, got {other:?}"),
        }
        assert_eq!(m.opt_str("nope").ok(), Some(None));
        assert_eq!(m.opt_str("a.str").ok(), Some(Some("hello")));
        assert_eq!(m.opt_bool("a.bool").ok(), Some(Some(true)));
        assert!(m.opt_bool("a.str").is_err());
        assert_eq!(m.opt_u32("a.i32").ok(), Some(Some(9)));
        assert_eq!(m.opt_u64("nope").ok(), Some(None));
        assert_eq!(m.opt_f32("a.f64").ok(), Some(Some(0.25)));
    }

    #[test]
    fn array_getters() {
        let m = sample();
        assert_eq!(m.get_str_array("a.strs").ok(), Some(vec!["x", "y"]));
        assert_eq!(m.get_f32_array("a.f32s").ok(), Some(vec![1.5, -2.0]));
        assert_eq!(m.get_i32_array("a.i32s").ok(), Some(vec![1, -2, 3]));
        assert_eq!(m.get_array("a.strs").map(<[Value]>::len).ok(), Some(2));
        assert!(matches!(
            m.get_str_array("a.mixed"),
            Err(GgufError::WrongType {
                expected: "array of string",
                found: "array of u8",
                ..
            })
        ));
        assert!(matches!(
            m.get_str_array("a.str"),
            Err(GgufError::WrongType {
                expected: "array of string",
                found: "string",
                ..
            })
        ));
        assert!(matches!(
            m.get_array("a.u32"),
            Err(GgufError::WrongType {
                expected: "array",
                found: "u32",
                ..
            })
        ));
    }
}
