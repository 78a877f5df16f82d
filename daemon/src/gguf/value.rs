//! Metadata values and their on-disk type ids.

/// One metadata value. Arrays are homogeneous on disk (one element type per array) but
/// may nest: an array of arrays holds inner arrays of any (each homogeneous) type.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    U64(u64),
    I64(i64),
    F32(f32),
    F64(f64),
    Bool(bool),
    String(String),
    Array(Vec<Value>),
}

/// The value type ids of the GGUF format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ValueType {
    U8,
    I8,
    U16,
    I16,
    U32,
    I32,
    F32,
    Bool,
    String,
    Array,
    U64,
    I64,
    F64,
}

impl ValueType {
    pub(crate) fn from_id(id: u32) -> Option<Self> {
        Some(match id {
            0 => Self::U8,
            1 => Self::I8,
            2 => Self::U16,
            3 => Self::I16,
            4 => Self::U32,
            5 => Self::I32,
            6 => Self::F32,
            7 => Self::Bool,
            8 => Self::String,
            9 => Self::Array,
            10 => Self::U64,
            11 => Self::I64,
            12 => Self::F64,
            _ => return None,
        })
    }

    pub(crate) fn id(self) -> u32 {
        match self {
            Self::U8 => 0,
            Self::I8 => 1,
            Self::U16 => 2,
            Self::I16 => 3,
            Self::U32 => 4,
            Self::I32 => 5,
            Self::F32 => 6,
            Self::Bool => 7,
            Self::String => 8,
            Self::Array => 9,
            Self::U64 => 10,
            Self::I64 => 11,
            Self::F64 => 12,
        }
    }

    /// The fewest bytes one value of this type occupies on disk. Array and string
    /// counts are checked against `remaining / min_size` before anything is allocated,
    /// so a crafted count cannot make the reader reserve more than the file backs.
    pub(crate) fn min_size(self) -> usize {
        match self {
            Self::U8 | Self::I8 | Self::Bool => 1,
            Self::U16 | Self::I16 => 2,
            Self::U32 | Self::I32 | Self::F32 => 4,
            Self::U64 | Self::I64 | Self::F64 => 8,
            // u64 length
            Self::String => 8,
            // u32 element type + u64 count
            Self::Array => 12,
        }
    }

    pub(crate) fn name(self) -> &'static str {
        match self {
            Self::U8 => "u8",
            Self::I8 => "i8",
            Self::U16 => "u16",
            Self::I16 => "i16",
            Self::U32 => "u32",
            Self::I32 => "i32",
            Self::F32 => "f32",
            Self::Bool => "bool",
            Self::String => "string",
            Self::Array => "array",
            Self::U64 => "u64",
            Self::I64 => "i64",
            Self::F64 => "f64",
        }
    }

    /// "array of <self>", as a static string for [`GgufError::WrongType`](super::GgufError).
    pub(crate) fn array_of_name(self) -> &'static str {
        match self {
            Self::U8 => "array of u8",
            Self::I8 => "array of i8",
            Self::U16 => "array of u16",
            Self::I16 => "array of i16",
            Self::U32 => "array of u32",
            Self::I32 => "array of i32",
            Self::F32 => "array of f32",
            Self::Bool => "array of bool",
            Self::String => "array of string",
            Self::Array => "array of array",
            Self::U64 => "array of u64",
            Self::I64 => "array of i64",
            Self::F64 => "array of f64",
        }
    }
}

impl Value {
    pub(crate) fn value_type(&self) -> ValueType {
        match self {
            Self::U8(_) => ValueType::U8,
            Self::I8(_) => ValueType::I8,
            Self::U16(_) => ValueType::U16,
            Self::I16(_) => ValueType::I16,
            Self::U32(_) => ValueType::U32,
            Self::I32(_) => ValueType::I32,
            Self::U64(_) => ValueType::U64,
            Self::I64(_) => ValueType::I64,
            Self::F32(_) => ValueType::F32,
            Self::F64(_) => ValueType::F64,
            Self::Bool(_) => ValueType::Bool,
            Self::String(_) => ValueType::String,
            Self::Array(_) => ValueType::Array,
        }
    }

    /// The GGUF name of this value's type ("u32", "string", "array", ...).
    pub fn type_name(&self) -> &'static str {
        self.value_type().name()
    }

    /// The value as an integer when it is one of the integer types.
    pub fn as_i128(&self) -> Option<i128> {
        Some(match *self {
            Self::U8(v) => v.into(),
            Self::I8(v) => v.into(),
            Self::U16(v) => v.into(),
            Self::I16(v) => v.into(),
            Self::U32(v) => v.into(),
            Self::I32(v) => v.into(),
            Self::U64(v) => v.into(),
            Self::I64(v) => v.into(),
            _ => return None,
        })
    }

    /// The value as a float when it is a float or an integer (integers round to the
    /// nearest `f64`).
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            Self::F32(v) => Some(v.into()),
            Self::F64(v) => Some(v),
            _ => self.as_i128().map(|v| v as f64),
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            Self::String(s) => Some(s),
            _ => None,
        }
    }

    pub fn as_array(&self) -> Option<&[Value]> {
        match self {
            Self::Array(a) => Some(a),
            _ => None,
        }
    }
}

impl From<&str> for Value {
    fn from(s: &str) -> Self {
        Self::String(s.to_owned())
    }
}

impl From<String> for Value {
    fn from(s: String) -> Self {
        Self::String(s)
    }
}

macro_rules! from_scalar {
    ($($t:ty => $v:ident),* $(,)?) => {
        $(impl From<$t> for Value {
            fn from(x: $t) -> Self {
                Self::$v(x)
            }
        })*
    };
}

from_scalar!(u8 => U8, i8 => I8, u16 => U16, i16 => I16, u32 => U32, i32 => I32,
    u64 => U64, i64 => I64, f32 => F32, f64 => F64, bool => Bool);

impl<T: Into<Value>> From<Vec<T>> for Value {
    fn from(v: Vec<T>) -> Self {
        Self::Array(v.into_iter().map(Into::into).collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn type_ids_round_trip() {
        for id in 0..=12 {
            let t = ValueType::from_id(id).expect("ids 0..=12 are defined");
            assert_eq!(t.id(), id);
        }
        assert_eq!(ValueType::from_id(13), None);
    }

    #[test]
    fn numeric_views() {
        assert_eq!(Value::I8(-3).as_i128(), Some(-3));
        assert_eq!(Value::U64(u64::MAX).as_i128(), Some(u64::MAX as i128));
        assert_eq!(Value::F32(1.5).as_i128(), None);
        assert_eq!(Value::U16(7).as_f64(), Some(7.0));
        assert_eq!(Value::String("x".into()).as_f64(), None);
    }

    #[test]
    fn conversions_build_nested_arrays() {
        let v: Value = vec![vec![1u8, 2], vec![3]].into();
        assert_eq!(
            v,
            Value::Array(vec![
                Value::Array(vec![Value::U8(1), Value::U8(2)]),
                Value::Array(vec![Value::U8(3)]),
            ])
        );
        assert_eq!(v.type_name(), "array");
    }
}
