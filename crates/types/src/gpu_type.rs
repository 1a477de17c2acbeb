//! GPU type names: matched case-insensitively, ignoring spaces, dashes and vendor words.

use std::fmt;

use serde::{Deserialize, Serialize};

/// A GPU model as tenants name it. Two names are the same type when their keys are equal:
/// `RTX 4090`, `rtx-4090` and `NVIDIA GeForce RTX 4090` all have the key `rtx4090`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct GpuType {
    key: String,
    display: String,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GpuTypeError {
    #[error("GPU type is empty")]
    Empty,
    #[error("GPU type {0:?} is too long (at most 64 characters)")]
    TooLong(String),
    #[error("GPU type {0:?} may only hold letters, digits, spaces, dashes and underscores")]
    BadCharacters(String),
}

/// Words a vendor puts before the model name that tenants leave out.
const VENDOR_WORDS: [&str; 4] = ["nvidia", "geforce", "tesla", "quadro"];

impl GpuType {
    pub fn parse(name: &str) -> Result<Self, GpuTypeError> {
        let name = name.trim();
        if name.is_empty() {
            return Err(GpuTypeError::Empty);
        }
        if name.len() > 64 {
            return Err(GpuTypeError::TooLong(name.to_owned()));
        }
        if !name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, ' ' | '-' | '_'))
        {
            return Err(GpuTypeError::BadCharacters(name.to_owned()));
        }
        let words: Vec<&str> = name
            .split([' ', '_'])
            .filter(|w| !w.is_empty() && !VENDOR_WORDS.contains(&w.to_ascii_lowercase().as_str()))
            .collect();
        let display = if words.is_empty() {
            name.to_owned()
        } else {
            words.join("-")
        };
        let display = display.to_ascii_uppercase();
        let key: String = display
            .chars()
            .filter(|c| c.is_ascii_alphanumeric())
            .map(|c| c.to_ascii_lowercase())
            .collect();
        if key.is_empty() {
            return Err(GpuTypeError::Empty);
        }
        Ok(GpuType { key, display })
    }

    /// The type of a GPU as its driver names it (`NVIDIA GeForce RTX 4090`): characters a
    /// tenant could not type are dropped, and an unusable name becomes `UNKNOWN`.
    pub fn from_driver_name(name: &str) -> Self {
        let cleaned: String = name
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '-' {
                    c
                } else {
                    ' '
                }
            })
            .take(64)
            .collect();
        GpuType::parse(&cleaned).unwrap_or_else(|_| GpuType {
            key: "unknown".to_owned(),
            display: "UNKNOWN".to_owned(),
        })
    }

    /// The comparison key: lower case, letters and digits only.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// The name shown to people: upper case, vendor words dropped, words joined by dashes.
    pub fn display(&self) -> &str {
        &self.display
    }
}

impl fmt::Display for GpuType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.display)
    }
}

impl TryFrom<String> for GpuType {
    type Error = GpuTypeError;
    fn try_from(s: String) -> Result<Self, Self::Error> {
        GpuType::parse(&s)
    }
}

impl From<GpuType> for String {
    fn from(t: GpuType) -> String {
        t.display
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_of_one_model_share_a_key() {
        let names = [
            "rtx4090",
            "RTX 4090",
            "RTX-4090",
            "NVIDIA GeForce RTX 4090",
            " rtx_4090 ",
        ];
        for n in names {
            assert_eq!(
                GpuType::parse(n).map(|t| t.key().to_owned()),
                Ok("rtx4090".to_owned()),
                "{n}"
            );
        }
        assert_eq!(
            GpuType::parse("NVIDIA H200").map(|t| t.display().to_owned()),
            Ok("H200".into())
        );
        assert_eq!(
            GpuType::parse("A100-80GB").map(|t| t.key().to_owned()),
            Ok("a10080gb".into())
        );
    }

    #[test]
    fn driver_names_become_types() {
        assert_eq!(
            GpuType::from_driver_name("NVIDIA GeForce RTX 4090 (Laptop)").display(),
            "RTX-4090-LAPTOP"
        );
        assert_eq!(GpuType::from_driver_name("NVIDIA H200").key(), "h200");
        assert_eq!(GpuType::from_driver_name("()").key(), "unknown");
    }

    #[test]
    fn rejects_bad_names() {
        assert_eq!(GpuType::parse("  "), Err(GpuTypeError::Empty));
        assert!(matches!(
            GpuType::parse("rtx;drop"),
            Err(GpuTypeError::BadCharacters(_))
        ));
        assert!(matches!(
            GpuType::parse(&"x".repeat(65)),
            Err(GpuTypeError::TooLong(_))
        ));
    }
}
