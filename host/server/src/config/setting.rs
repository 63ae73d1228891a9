//! How one setting is declared once and read from every layer: `settings!` turns each line of
//! `config/mod.rs` (name, type, default, check, doc) into a field of `ServeConfig`, its default,
//! its check, and a `SettingInfo` from which the command builds its flag and environment
//! variable and the README its table. `SettingValue` reads a value from a flag's or a
//! variable's text and from a TOML value, and shows one, for every type a setting has.

use std::net::SocketAddr;
use std::path::PathBuf;

/// A setting as the command line, the environment, the file and the docs name it.
#[derive(Clone, Debug)]
pub struct SettingInfo {
    /// The file key, e.g. `lease_ms`.
    pub name: &'static str,
    /// What it is, from its doc comment: the first line is the README's; all of it is `--help`'s.
    pub doc: &'static str,
    /// The default, as `--help` and the README show it.
    pub default_text: String,
    /// The default as a config file writes it (none when unset by default).
    pub default_toml: Option<toml::Value>,
    /// Every value it takes, when they are few (a boolean's): the command lists them.
    pub choices: Option<&'static [&'static str]>,
}

impl SettingInfo {
    /// `--lease-ms`'s name without the dashes.
    pub fn flag(&self) -> String {
        self.name.replace('_', "-")
    }

    /// `SLUICE_LEASE_MS`.
    pub fn env(&self) -> String {
        format!("SLUICE_{}", self.name.to_ascii_uppercase())
    }

    /// The first line of the doc: a short description.
    pub fn summary(&self) -> &'static str {
        self.doc.lines().next().unwrap_or_default().trim()
    }
}

/// A type a setting can have.
pub trait SettingValue: Sized {
    /// Every value of the type, when they are few enough to list in an error.
    const CHOICES: Option<&'static [&'static str]> = None;
    /// From a flag's or an environment variable's text.
    fn parse(text: &str) -> Result<Self, String>;
    /// From the config file.
    fn from_toml(value: toml::Value) -> Result<Self, String>;
    /// As `--help` and the README show it, and as `parse` reads it back.
    fn show(&self) -> String;
    /// As a config file writes it, and as `from_toml` reads it back; none for an unset value.
    fn to_toml(&self) -> Option<toml::Value>;
}

fn wrong_type(value: &toml::Value, wanted: &str) -> String {
    format!("expected {wanted}, found {}", value.type_str())
}

macro_rules! integer_setting {
    ($($ty:ty),*) => {$(
        impl SettingValue for $ty {
            fn parse(text: &str) -> Result<Self, String> {
                text.trim()
                    .replace('_', "")
                    .parse()
                    .map_err(|e| format!("`{text}` is not a whole number in range: {e}"))
            }

            fn from_toml(value: toml::Value) -> Result<Self, String> {
                match value {
                    toml::Value::Integer(n) => <$ty>::try_from(n)
                        .map_err(|_| format!("{n} is out of range")),
                    other => Err(wrong_type(&other, "a whole number")),
                }
            }

            fn show(&self) -> String {
                self.to_string()
            }

            fn to_toml(&self) -> Option<toml::Value> {
                i64::try_from(*self).ok().map(toml::Value::Integer)
            }
        }
    )*};
}

integer_setting!(u32, u64, usize);

impl SettingValue for bool {
    const CHOICES: Option<&'static [&'static str]> = Some(&["true", "false"]);

    fn parse(text: &str) -> Result<Self, String> {
        match text.trim() {
            "true" => Ok(true),
            "false" => Ok(false),
            other => Err(format!("`{other}` is not true or false")),
        }
    }

    fn from_toml(value: toml::Value) -> Result<Self, String> {
        match value {
            toml::Value::Boolean(b) => Ok(b),
            other => Err(wrong_type(&other, "true or false")),
        }
    }

    fn show(&self) -> String {
        self.to_string()
    }

    fn to_toml(&self) -> Option<toml::Value> {
        Some(toml::Value::Boolean(*self))
    }
}

/// Text-like values read from a TOML string.
macro_rules! text_setting {
    ($($ty:ty => $what:literal),*) => {$(
        impl SettingValue for $ty {
            fn parse(text: &str) -> Result<Self, String> {
                text.parse().map_err(|e| format!("`{text}` is not {}: {e}", $what))
            }

            fn from_toml(value: toml::Value) -> Result<Self, String> {
                match value {
                    toml::Value::String(text) => Self::parse(&text),
                    other => Err(wrong_type(&other, $what)),
                }
            }

            fn show(&self) -> String {
                self.to_string()
            }

            fn to_toml(&self) -> Option<toml::Value> {
                Some(toml::Value::String(self.to_string()))
            }
        }
    )*};
}

text_setting!(String => "text", SocketAddr => "an address (host:port)");

impl SettingValue for PathBuf {
    fn parse(text: &str) -> Result<Self, String> {
        if text.is_empty() {
            return Err("an empty path".to_owned());
        }
        Ok(PathBuf::from(text))
    }

    fn from_toml(value: toml::Value) -> Result<Self, String> {
        match value {
            toml::Value::String(text) => Self::parse(&text),
            other => Err(wrong_type(&other, "a path")),
        }
    }

    fn show(&self) -> String {
        self.display().to_string()
    }

    fn to_toml(&self) -> Option<toml::Value> {
        Some(toml::Value::String(self.show()))
    }
}

/// Unset by default; a flag, variable or key gives it.
impl<T: SettingValue> SettingValue for Option<T> {
    fn parse(text: &str) -> Result<Self, String> {
        T::parse(text).map(Some)
    }

    fn from_toml(value: toml::Value) -> Result<Self, String> {
        T::from_toml(value).map(Some)
    }

    fn show(&self) -> String {
        match self {
            Some(value) => value.show(),
            None => "none".to_owned(),
        }
    }

    fn to_toml(&self) -> Option<toml::Value> {
        self.as_ref().and_then(T::to_toml)
    }
}

/// A list: comma-separated on the command line and in the environment, an array in the file.
impl SettingValue for Vec<String> {
    /// An empty text is an empty list; an empty item in a list is refused, as it is in the file.
    fn parse(text: &str) -> Result<Self, String> {
        if text.trim().is_empty() {
            return Ok(Vec::new());
        }
        text.split(',')
            .map(str::trim)
            .map(|item| match item {
                "" => Err(format!("`{text}` has an empty item")),
                item => Ok(item.to_owned()),
            })
            .collect()
    }

    fn from_toml(value: toml::Value) -> Result<Self, String> {
        match value {
            toml::Value::Array(items) => items
                .into_iter()
                .map(|item| match item {
                    toml::Value::String(text) => Ok(text),
                    other => Err(wrong_type(&other, "a list of strings")),
                })
                .collect(),
            other => Err(wrong_type(&other, "a list of strings")),
        }
    }

    fn show(&self) -> String {
        if self.is_empty() {
            "none".to_owned()
        } else {
            self.join(",")
        }
    }

    fn to_toml(&self) -> Option<toml::Value> {
        Some(toml::Value::Array(
            self.iter().cloned().map(toml::Value::String).collect(),
        ))
    }
}

/// A check that `value` lies in `range`, failing with `must be {words}`.
pub fn within<T: PartialOrd>(
    range: std::ops::RangeInclusive<T>,
    words: &'static str,
) -> impl Fn(&T) -> Result<(), String> {
    move |value| {
        if range.contains(value) {
            Ok(())
        } else {
            Err(format!("must be {words}"))
        }
    }
}

/// A setting any value of whose type is valid (or that is checked with others, in `check`).
pub fn any<T>(_: &T) -> Result<(), String> {
    Ok(())
}

/// Declares the settings: `ServeConfig`'s fields, their defaults, their checks and their docs,
/// in one list. Each entry is `/// doc` lines, `name: Type = default, check;`. Extra fields
/// that are not settings of their own (tables in the file) follow `;;` with their defaults.
macro_rules! settings {
    (
        $( $(#[doc = $doc:literal])+ $name:ident : $ty:ty = $default:expr, $check:expr; )+
        ;;
        $( $(#[doc = $xdoc:literal])+ $xname:ident : $xty:ty = $xdefault:expr; )*
    ) => {
        /// Everything `sluice serve` needs, resolved.
        #[derive(Clone, Debug)]
        pub struct ServeConfig {
            $( $(#[doc = $doc])+ pub $name: $ty, )+
            $( $(#[doc = $xdoc])+ pub $xname: $xty, )*
        }

        impl Default for ServeConfig {
            fn default() -> Self {
                ServeConfig {
                    $( $name: $default, )+
                    $( $xname: $xdefault, )*
                }
            }
        }

        impl ServeConfig {
            /// Every setting a flag, a variable and a file key can give, in declaration order.
            pub fn settings() -> Vec<$crate::config::setting::SettingInfo> {
                let defaults = ServeConfig::default();
                vec![$(
                    $crate::config::setting::SettingInfo {
                        name: stringify!($name),
                        doc: concat!($($doc, "\n"),+),
                        default_text: $crate::config::setting::SettingValue::show(
                            &defaults.$name,
                        ),
                        default_toml: $crate::config::setting::SettingValue::to_toml(
                            &defaults.$name,
                        ),
                        choices: <$ty as $crate::config::setting::SettingValue>::CHOICES,
                    },
                )+]
            }

            /// Every setting's value as a config file would write it (unset ones left out).
            pub fn to_table(&self) -> toml::Table {
                let mut table = toml::Table::new();
                $(
                    if let Some(value) =
                        $crate::config::setting::SettingValue::to_toml(&self.$name)
                    {
                        table.insert(stringify!($name).to_owned(), value);
                    }
                )+
                table
            }

            /// Sets the setting `name` from a flag's or a variable's text; false for a name
            /// that is no setting.
            fn set_text(&mut self, name: &str, text: &str) -> Result<bool, ConfigError> {
                match name {
                    $( stringify!($name) => {
                        self.$name = <$ty as $crate::config::setting::SettingValue>::parse(text)
                            .map_err(|reason| ConfigError::Invalid {
                                name: stringify!($name),
                                reason,
                            })?;
                        Ok(true)
                    } )+
                    _ => Ok(false),
                }
            }

            /// Sets the setting `name` from the file; false for a name that is no setting.
            fn set_toml(&mut self, name: &str, value: toml::Value) -> Result<bool, ConfigError> {
                match name {
                    $( stringify!($name) => {
                        self.$name =
                            <$ty as $crate::config::setting::SettingValue>::from_toml(value)
                                .map_err(|reason| ConfigError::Invalid {
                                    name: stringify!($name),
                                    reason,
                                })?;
                        Ok(true)
                    } )+
                    _ => Ok(false),
                }
            }

            /// Each setting's own check.
            fn check_each(&self) -> Result<(), ConfigError> {
                $(
                    ($check)(&self.$name).map_err(|reason| ConfigError::Invalid {
                        name: stringify!($name),
                        reason,
                    })?;
                )+
                Ok(())
            }
        }
    };
}

pub(crate) use settings;
