//! Every test that starts a process does so under the deadline helper
//! (`ferrotron_test_support::deadline`), so that no regression can hang CI:
//! test code outside this crate never calls `Command::output` or
//! `Command::status`, which wait without end. (`spawn` stays allowed: the
//! tests that kill their child on purpose hold it themselves.)

use std::path::{Path, PathBuf};

/// The `.rs` files under `dir`, recursively.
fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let path = e.path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|x| x == "rs") {
            out.push(path);
        }
    }
}

/// The test code of the workspace: each crate's `tests/` and the root's.
fn test_files() -> Vec<PathBuf> {
    // The crate's directory as cargo gives it when it runs the test, so a
    // binary built in another checkout of the same target directory reads
    // this checkout's files.
    let crate_dir = std::env::var_os("CARGO_MANIFEST_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")));
    let root = crate_dir.join("../..");
    let mut dirs = vec![root.join("tests")];
    for e in std::fs::read_dir(root.join("crates")).unwrap().flatten() {
        let name = e.file_name();
        if name != "test-support" {
            dirs.push(e.path().join("tests"));
        }
    }
    let mut files = Vec::new();
    for d in dirs {
        rust_files(&d, &mut files);
    }
    files
}

#[test]
fn no_test_waits_on_a_process_without_a_deadline() {
    let files = test_files();
    assert!(files.len() > 30, "only {} test files found", files.len());
    let mut bare = Vec::new();
    for file in &files {
        let text = std::fs::read_to_string(file).unwrap();
        for (i, line) in text.lines().enumerate() {
            if line.contains(".output()") || line.contains(".status()") {
                bare.push(format!("{}:{}: {}", file.display(), i + 1, line.trim()));
            }
        }
    }
    assert!(
        bare.is_empty(),
        "processes waited on without a deadline (use ferrotron_test_support::deadline::output_within):\n{}",
        bare.join("\n")
    );
}
