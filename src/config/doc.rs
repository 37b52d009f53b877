//! What the configuration reference (`concord docs config`, `docs/configuration.md`) is
//! made of: the schema's own doc comments, and serde's own list of the keys.
//!
//! Doc comments are gone by run time, so each section struct and each enum a key takes
//! is written inside `documented!`, which emits the item unchanged and records its doc
//! lines, field names and types. The key names come from serde itself ([`serde_names`]),
//! so a rename cannot make the page name a key the parser refuses.
use serde::de::{self, DeserializeOwned, Visitor};

/// The doc lines of an item's attributes: `Some(line)` for a `#[doc]` (a `///` line),
/// `None` for any other attribute.
pub type DocLines = &'static [Option<&'static str>];

/// One field of a documented struct, as written in the source.
pub struct FieldDoc {
    pub name: &'static str,
    /// `stringify!` of its Rust type (`Option < f64 >`).
    pub ty: &'static str,
    pub doc: DocLines,
}

/// A struct whose doc comments are kept (`documented!`).
pub trait DocumentedStruct {
    const DOC: DocLines;
    const FIELDS: &'static [FieldDoc];
    /// Each field's value as TOML, in the order of `FIELDS` (None: unset).
    fn values(&self) -> Vec<Option<toml::Value>>;
}

/// An enum of unit variants whose doc comments are kept (`documented!`).
pub trait DocumentedEnum {
    const NAME: &'static str;
    /// `(variant, its doc lines)` in declaration order.
    const VARIANTS: &'static [(&'static str, DocLines)];
}

/// `Some(line)` for a doc attribute's tokens, `None` for any other attribute's.
macro_rules! doc_line {
    (doc = $s:literal) => {
        Some($s)
    };
    ($($other:tt)*) => {
        None
    };
}
pub(crate) use doc_line;

/// Emits a struct (named fields) or an enum (unit variants) unchanged and implements
/// [`DocumentedStruct`] or [`DocumentedEnum`] for it.
macro_rules! documented {
    (
        $(#[$($attr:tt)*])*
        $vis:vis struct $name:ident {
            $( $(#[$($fattr:tt)*])* $fvis:vis $field:ident : $ty:ty ),* $(,)?
        }
    ) => {
        $(#[$($attr)*])*
        $vis struct $name { $( $(#[$($fattr)*])* $fvis $field : $ty ),* }

        impl $crate::config::doc::DocumentedStruct for $name {
            const DOC: $crate::config::doc::DocLines =
                &[$($crate::config::doc::doc_line!($($attr)*)),*];
            const FIELDS: &'static [$crate::config::doc::FieldDoc] = &[$(
                $crate::config::doc::FieldDoc {
                    name: stringify!($field),
                    ty: stringify!($ty),
                    doc: &[$($crate::config::doc::doc_line!($($fattr)*)),*],
                }
            ),*];
            fn values(&self) -> Vec<Option<toml::Value>> {
                vec![$(toml::Value::try_from(&self.$field).ok()),*]
            }
        }
    };
    (
        $(#[$($attr:tt)*])*
        $vis:vis enum $name:ident {
            $( $(#[$($vattr:tt)*])* $variant:ident ),* $(,)?
        }
    ) => {
        $(#[$($attr)*])*
        $vis enum $name { $( $(#[$($vattr)*])* $variant ),* }

        impl $crate::config::doc::DocumentedEnum for $name {
            const NAME: &'static str = stringify!($name);
            const VARIANTS: &'static [(&'static str, $crate::config::doc::DocLines)] = &[$(
                (stringify!($variant), &[$($crate::config::doc::doc_line!($($vattr)*)),*])
            ),*];
        }
    };
}
pub(crate) use documented;

/// The names serde reads for `T`: a struct's keys or an enum's variants, in declaration
/// order, as renamed. Empty for any other type.
pub fn serde_names<T: DeserializeOwned>() -> &'static [&'static str] {
    let mut probe = Probe::default();
    // The probe always fails: it only records what the derived code asks it for.
    let _ = T::deserialize(&mut probe);
    probe.names
}

/// A deserializer that records the field or variant list a derived `Deserialize` hands
/// it, and deserializes nothing.
#[derive(Default)]
struct Probe {
    names: &'static [&'static str],
}

type ProbeError = de::value::Error;

fn probed<T>() -> Result<T, ProbeError> {
    Err(de::Error::custom("a probe reads no values"))
}

impl<'de> de::Deserializer<'de> for &mut Probe {
    type Error = ProbeError;

    fn deserialize_any<V: Visitor<'de>>(self, _: V) -> Result<V::Value, ProbeError> {
        probed()
    }

    fn deserialize_struct<V: Visitor<'de>>(
        self,
        _: &'static str,
        fields: &'static [&'static str],
        _: V,
    ) -> Result<V::Value, ProbeError> {
        self.names = fields;
        probed()
    }

    fn deserialize_enum<V: Visitor<'de>>(
        self,
        _: &'static str,
        variants: &'static [&'static str],
        _: V,
    ) -> Result<V::Value, ProbeError> {
        self.names = variants;
        probed()
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes
        byte_buf option unit unit_struct newtype_struct seq tuple tuple_struct map
        identifier ignored_any
    }
}
