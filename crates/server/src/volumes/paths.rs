//! Where a volume may be mounted in an instance: an absolute, plain path that is neither a
//! system directory nor one the executors own, and no two mounts one inside another.

/// Directories an instance needs as they are (the node's system, read-only in the process
/// executor's sandbox, or the container's own): no mount at or under them.
const SYSTEM: [&str; 15] = [
    "/bin", "/boot", "/dev", "/etc", "/lib", "/lib32", "/lib64", "/libx32", "/opt", "/proc",
    "/run", "/sbin", "/sys", "/usr", "/var/run",
];
/// Directories the executors give an instance (its home, its checkpoint volume, its scratch
/// space): no mount exactly there, though one may go under `/home` or `/mnt`.
const OWNED: [&str; 9] = [
    "/",
    "/instance",
    "/checkpoint",
    "/tmp",
    "/home",
    "/root",
    "/var",
    "/mnt",
    "/srv",
];
/// The longest mount path.
const PATH_MAX: usize = 255;

/// Why `path` cannot take a volume, if it cannot.
pub fn check(path: &str) -> Result<(), String> {
    if !path.starts_with('/') {
        return Err(format!("{path:?} is not an absolute path (/workspace)"));
    }
    if path.len() > PATH_MAX {
        return Err(format!("a mount path has at most {PATH_MAX} characters"));
    }
    let trimmed = path.trim_end_matches('/');
    let plain = trimmed.split('/').skip(1).all(|c| {
        !c.is_empty()
            && c != "."
            && c != ".."
            && c.chars()
                .all(|ch| ch.is_ascii_alphanumeric() || matches!(ch, '.' | '_' | '-'))
    });
    if !trimmed.is_empty() && !plain {
        return Err(format!(
            "{path:?}: each part of a mount path is letters, digits and . _ -, not . or .."
        ));
    }
    let path = if trimmed.is_empty() { "/" } else { trimmed };
    if let Some(system) = SYSTEM.iter().find(|s| within(path, s)) {
        return Err(format!(
            "{path} is a system directory ({system}); mount a volume elsewhere, such as /workspace or /data"
        ));
    }
    if OWNED.contains(&path) {
        return Err(format!(
            "{path} is the instance's own; mount a volume elsewhere, such as /workspace or /data"
        ));
    }
    Ok(())
}

/// Why these paths cannot all be mounted together: the same path twice, or one inside another.
pub fn check_all<'a>(paths: impl IntoIterator<Item = &'a str>) -> Result<(), String> {
    let paths: Vec<&str> = paths.into_iter().map(|p| p.trim_end_matches('/')).collect();
    for (i, a) in paths.iter().enumerate() {
        for b in &paths[i + 1..] {
            if within(a, b) || within(b, a) {
                return Err(format!(
                    "the mounts at {a} and {b} overlap; give each volume a path of its own"
                ));
            }
        }
    }
    Ok(())
}

/// Whether `path` is `dir` or under it.
fn within(path: &str, dir: &str) -> bool {
    path == dir
        || path
            .strip_prefix(dir)
            .is_some_and(|rest| rest.starts_with('/'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn volumes_go_where_the_instance_has_room_for_them() {
        for ok in [
            "/workspace",
            "/data",
            "/data/sets",
            "/home/me",
            "/mnt/ckpt",
            "/workspace/",
        ] {
            assert_eq!(check(ok), Ok(()), "{ok}");
        }
        for (bad, why) in [
            ("workspace", "absolute"),
            ("/", "own"),
            ("/etc", "system"),
            ("/usr/local/data", "system"),
            ("/proc/x", "system"),
            ("/var/run/x", "system"),
            ("/tmp", "own"),
            ("/checkpoint", "own"),
            ("/instance", "own"),
            ("/data/../etc", "each part"),
            ("/data//x", "each part"),
            ("/data/$HOME", "each part"),
        ] {
            let err = check(bad).expect_err(bad);
            assert!(err.contains(why), "{bad}: {err}");
        }
        assert!(check(&format!("/{}", "a".repeat(300))).is_err());
    }

    #[test]
    fn mounts_do_not_overlap() {
        assert_eq!(check_all(["/data", "/workspace", "/database"]), Ok(()));
        assert!(check_all(["/data", "/data/"])
            .unwrap_err()
            .contains("overlap"));
        assert!(check_all(["/data", "/data/sets"])
            .unwrap_err()
            .contains("overlap"));
    }
}
