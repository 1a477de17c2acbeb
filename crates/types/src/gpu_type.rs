//! GPU type names: matched case-insensitively, ignoring spaces, dashes, dots and vendor
//! words; a MIG instance's type (`H200 MIG 3g.71gb`) names its parent model and its slice.

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
    #[error("GPU type {0:?} may only hold letters, digits, spaces, dashes, dots and underscores")]
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
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, ' ' | '-' | '_' | '.'))
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
                // The dot of a MIG profile (`3g.71gb`) is kept.
                if c.is_ascii_alphanumeric() || c == '-' || c == '.' {
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

    /// The comparison key: lower case, letters and digits only (`h200mig3g71gb`).
    pub fn key(&self) -> &str {
        &self.key
    }

    /// The name shown to people: upper case, vendor words dropped, words joined by dashes.
    pub fn display(&self) -> &str {
        &self.display
    }

    /// The slice of its parent GPU a MIG instance's type stands for (`H200-MIG-3G.71GB`: 3 of
    /// the H200's 7 compute slices, 71 GB); `None` for a whole GPU's type.
    pub fn mig(&self) -> Option<MigSlice> {
        let tokens: Vec<&str> = self.display.split('-').collect();
        // The last `MIG` with a model before it and a profile after it.
        let at = (1..tokens.len().saturating_sub(1))
            .rev()
            .find(|&i| tokens[i] == "MIG" && parse_profile(tokens[i + 1]).is_some())?;
        let (compute_slices, memory_gb) = parse_profile(tokens[at + 1])?;
        let parent = GpuType::parse(&tokens[..at].join("-")).ok()?;
        let parent_compute_slices = compute_slices_of(&parent);
        Some(MigSlice {
            compute_slices: compute_slices.min(parent_compute_slices),
            parent_compute_slices,
            memory_gb,
            parent,
        })
    }
}

/// What a MIG instance is of its parent GPU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MigSlice {
    /// The whole GPU's type (`H200`).
    pub parent: GpuType,
    /// The compute slices it has (`3` of a `3g`; `1` of a compute instance `1c.3g.71gb`
    /// that shares its GPU instance with others).
    pub compute_slices: u32,
    /// The compute slices of the whole GPU: 7 (A100, H100, H200, B200), 4 (A30, RTX PRO
    /// 6000), from NVIDIA's MIG user guide.
    pub parent_compute_slices: u32,
    /// The memory its profile names, in GB (`71` of `3g.71gb`).
    pub memory_gb: u32,
}

/// `3G.71GB` → (3, 71); `1C.3G.71GB` (one compute instance of a 3g GPU instance) → (1, 71).
fn parse_profile(token: &str) -> Option<(u32, u32)> {
    let parts: Vec<&str> = token.split('.').collect();
    let number = |s: &str, unit: &str| -> Option<u32> {
        let n = s.strip_suffix(unit)?;
        if n.is_empty() || !n.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        n.parse().ok().filter(|&n| n > 0)
    };
    match parts.as_slice() {
        [g, mem] => Some((number(g, "G")?, number(mem, "GB")?)),
        [c, g, mem] => {
            number(g, "G")?;
            Some((number(c, "C")?, number(mem, "GB")?))
        }
        _ => None,
    }
}

/// The GPUs whose MIG mode splits them in 4 rather than 7 compute slices.
fn compute_slices_of(parent: &GpuType) -> u32 {
    let key = parent.key();
    if key.starts_with("a30") || key.starts_with("rtxpro6000") {
        4
    } else {
        7
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
    fn mig_types_keep_their_profile_and_name_their_parent() {
        let from_driver = GpuType::from_driver_name("NVIDIA H200 MIG 3g.71gb");
        assert_eq!(from_driver.display(), "H200-MIG-3G.71GB");
        assert_eq!(from_driver.key(), "h200mig3g71gb");
        for typed in ["H200 MIG 3g.71gb", "h200 mig 3g.71gb", "H200-MIG-3G.71GB"] {
            assert_eq!(GpuType::parse(typed).as_ref(), Ok(&from_driver), "{typed}");
        }
        // The display round-trips (the store keeps it and parses it back).
        assert_eq!(
            GpuType::from_driver_name(from_driver.display()),
            from_driver
        );
        assert_ne!(
            GpuType::parse("H200 MIG 1g.18gb").map(|t| t.key().to_owned()),
            Ok(from_driver.key().to_owned())
        );
        let slice = from_driver.mig();
        assert_eq!(
            slice,
            Some(MigSlice {
                parent: GpuType::parse("H200").unwrap_or_else(|e| panic!("{e}")),
                compute_slices: 3,
                parent_compute_slices: 7,
                memory_gb: 71,
            })
        );
        assert_eq!(
            slice.map(|s| s.parent.key().to_owned()),
            Some("h200".into())
        );
        let a100 = GpuType::from_driver_name("NVIDIA A100-SXM4-80GB MIG 1c.3g.40gb").mig();
        assert_eq!(
            a100.map(|s| (s.parent.display().to_owned(), s.compute_slices, s.memory_gb)),
            Some(("A100-SXM4-80GB".into(), 1, 40))
        );
        let a30 = GpuType::from_driver_name("NVIDIA A30 MIG 2g.12gb").mig();
        assert_eq!(a30.map(|s| s.parent_compute_slices), Some(4));
        // Whole GPUs, and names that only look alike, are no MIG slices.
        for whole in [
            "H200",
            "RTX 4090",
            "A100-80GB",
            "MIG 3g.71gb",
            "H200 MIG",
            "H200 MIG 3g",
        ] {
            assert_eq!(
                GpuType::parse(whole).ok().and_then(|t| t.mig()),
                None,
                "{whole}"
            );
        }
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
