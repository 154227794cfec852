//! A test that cannot run in this build or on this machine says why and
//! passes, except where everything must run: `scripts/test --mpi` (what CI
//! runs) sets [`NO_SKIP`], and there a skip is a failure, so no multi-rank
//! or wgpu test can pass by not running.

/// The environment variable that makes a skip a failure when it is `1`.
pub const NO_SKIP: &str = "FERROTRON_TEST_NO_SKIP";

/// Whether skips are failures in this run.
pub fn forbidden() -> bool {
    std::env::var(NO_SKIP).is_ok_and(|v| v == "1")
}

/// Skips the calling test for `reason` (printed as `SKIPPED: reason`), or
/// panics with it when [`forbidden`]. The caller returns after it.
pub fn skip(reason: &str) {
    assert!(
        !forbidden(),
        "SKIPPED, which {NO_SKIP}=1 (set by scripts/test --mpi) makes a failure: {reason}"
    );
    eprintln!("SKIPPED: {reason}");
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Both outcomes, in a child process of this test binary with the
    /// variable set or removed (the variable is process-wide).
    #[test]
    fn a_skip_passes_unless_the_variable_forbids_it() {
        if std::env::var_os("FERROTRON_SKIP_TEST_CHILD").is_some() {
            skip("the child's reason");
            return;
        }
        let run = |forbid: bool| {
            let mut cmd = std::process::Command::new(std::env::current_exe().unwrap());
            cmd.args([
                "--exact",
                "skip::tests::a_skip_passes_unless_the_variable_forbids_it",
                "--nocapture",
            ])
            .env("FERROTRON_SKIP_TEST_CHILD", "1");
            if forbid {
                cmd.env(NO_SKIP, "1");
            } else {
                cmd.env_remove(NO_SKIP);
            }
            crate::deadline::output_within(&mut cmd, std::time::Duration::from_secs(60)).unwrap()
        };
        let allowed = run(false);
        let err = String::from_utf8_lossy(&allowed.stderr);
        assert!(allowed.status.success(), "{err}");
        assert!(err.contains("SKIPPED: the child's reason"), "{err}");
        let refused = run(true);
        let out = String::from_utf8_lossy(&refused.stdout).to_string()
            + &String::from_utf8_lossy(&refused.stderr);
        assert!(!refused.status.success(), "{out}");
        assert!(out.contains("makes a failure: the child's reason"), "{out}");
    }
}
