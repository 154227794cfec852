//! The output files of the `bench` commands, checked before anything is
//! measured (a GPU lease's minutes are not spent on a result that cannot
//! be written).

use std::path::{Path, PathBuf};

use crate::error::usage;

/// Checks that `path` (given to `flag`) can be written: its directory
/// exists, it is not a directory, and it is none of `inputs` (compared as
/// absolute paths with links resolved, so `./x.json` is `x.json`).
pub fn check_output(flag: &str, path: &Path, inputs: &[PathBuf]) -> anyhow::Result<()> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    if !dir.is_dir() {
        return Err(usage(format!(
            "{flag} {}: directory {} does not exist",
            path.display(),
            dir.display()
        )));
    }
    if path.is_dir() {
        return Err(usage(format!("{flag} {}: is a directory", path.display())));
    }
    let resolved = |p: &Path| std::fs::canonicalize(p).ok();
    let out = resolved(dir).zip(path.file_name()).map(|(d, n)| d.join(n));
    if inputs
        .iter()
        .any(|i| i == path || (out.is_some() && resolved(i) == out))
    {
        return Err(usage(format!(
            "{flag} {}: is also an input",
            path.display()
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_input_named_another_way_is_refused() {
        let dir = std::env::temp_dir().join(format!("ferrotron-bench-out-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let input = dir.join("a.json");
        std::fs::write(&input, "{}").unwrap();
        // Equal as paths only once `sub/..` is resolved.
        std::fs::create_dir_all(dir.join("sub")).unwrap();
        let same = dir.join("sub").join("..").join("a.json");
        assert_ne!(same, input);
        let e = check_output("--json", &same, std::slice::from_ref(&input)).unwrap_err();
        assert!(e.to_string().contains("is also an input"), "{e}");
        check_output("--json", &dir.join("b.json"), &[input]).unwrap();
        let e = check_output("--json", &dir.join("no/b.json"), &[]).unwrap_err();
        assert!(e.to_string().contains("does not exist"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
