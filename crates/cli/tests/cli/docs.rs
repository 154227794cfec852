//! The documentation against the code, so that README.md and docs/ cannot
//! drift from the CLI again (issue 29 §4: the old README documented `--pp`
//! as "not implemented yet" long after it ran).
//!
//! For README.md and every `docs/**/*.md`:
//! - every relative Markdown link resolves to a file or directory of the
//!   repository, and its anchor, if it points into a Markdown page, to one
//!   of that page's headings;
//! - every `--flag` on a line that names `ferrotron` (a command split over
//!   lines with `\` counts as one line), and every `--flag` in a table row
//!   of docs/training.md, is an option of some `ferrotron` subcommand's
//!   `--help`, or one of the few foreign flags listed in [`FOREIGN`].
//!
//! And for docs/training.md, the page of the training configuration:
//! - every option of `ferrotron train --help` is documented in its key
//!   table, except the few that are not configuration keys;
//! - each row of that table names one `section.key` of a known section and
//!   a flag of `ferrotron train`, and the keys are exactly `JobConfig`'s
//!   (every key documented, no key that does not exist).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use ferrotron_job::SECTIONS;

use ferrotron_test_support::deadline;

/// The subcommands whose `--help` lists the flags the docs may name.
const SUBCOMMANDS: &[&[&str]] = &[
    &[],
    &["train"],
    &["generate"],
    &["eval"],
    &["export"],
    &["plan"],
    &["bench", "train"],
    &["bench", "kernels"],
    &["data", "prepare"],
    &["data", "verify"],
];

/// Flags the docs name on a line with `ferrotron` that belong to another
/// program.
const FOREIGN: &[&str] = &[
    // cargo: `cargo build --release -p ferrotron-cli --features mpi`,
    // `cargo test -p ferrotron-cli --test cli goldfish`,
    // `cargo test --workspace --features ferrotron-cli/mpi,...`.
    "--release",
    "--workspace",
    "--features",
    "--test",
    // libtest, after `cargo test ... --`: `--ignored --nocapture`.
    "--ignored",
    "--nocapture",
    // srun: `srun --mpi=pmix ./target/release/ferrotron train`.
    "--mpi",
    // sbatch: `#SBATCH --job-name=ferrotron-gpt2`.
    "--job-name",
    // scripts/make_hf_fixtures.py: `check-export --ferrotron BIN`.
    "--ferrotron",
    // scripts/cuda_compile_check.sh: `--sources DIR`.
    "--sources",
    // Megatron-LM's name for `--max-seq-len`, quoted in docs/training.md.
    "--max-position-embeddings",
];

/// Options of `ferrotron train` that are not configuration keys, so they
/// have no row in docs/training.md's key table.
const TRAIN_FLAGS_NOT_KEYS: &[&str] = &[
    "--help",
    "--config",
    "--resume",
    "--override",
    "--print-config",
];

/// `JobConfig`'s own list of `section.key` names (from the table that
/// declares the keys, not a copy): [`training_keys_match_the_job_config`]
/// requires every documented key to be a `JobConfig` key and every
/// `JobConfig` key to be documented.
fn job_config_keys() -> BTreeSet<String> {
    ferrotron_job::KEYS.iter().map(|k| k.path()).collect()
}

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// README.md and every Markdown file under docs/, with their text.
fn pages() -> Vec<(PathBuf, String)> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        let mut entries: Vec<_> = std::fs::read_dir(dir)
            .unwrap_or_else(|e| panic!("cannot read {}: {e}", dir.display()))
            .map(|e| e.unwrap().path())
            .collect();
        entries.sort();
        for path in entries {
            if path.is_dir() {
                walk(&path, out);
            } else if path.extension().is_some_and(|x| x == "md") {
                out.push(path);
            }
        }
    }
    let root = repo_root();
    let mut paths = vec![root.join("README.md")];
    walk(&root.join("docs"), &mut paths);
    paths
        .into_iter()
        .map(|p| {
            let text = std::fs::read_to_string(&p)
                .unwrap_or_else(|e| panic!("cannot read {}: {e}", p.display()));
            (p, text)
        })
        .collect()
}

fn name(path: &Path) -> String {
    path.strip_prefix(repo_root())
        .unwrap_or(path)
        .display()
        .to_string()
}

/// The `--flag`s written in `text`: `--` not preceded by a word character
/// or `-`, then a lowercase letter, then letters, digits and dashes.
fn flags_in(text: &str) -> Vec<String> {
    let b = text.as_bytes();
    let mut flags = Vec::new();
    let mut i = 0;
    while i + 2 < b.len() {
        let starts = b[i] == b'-'
            && b[i + 1] == b'-'
            && b[i + 2].is_ascii_lowercase()
            && (i == 0 || !(b[i - 1].is_ascii_alphanumeric() || b"-_".contains(&b[i - 1])));
        if starts {
            let mut j = i + 2;
            while j < b.len()
                && (b[j].is_ascii_lowercase() || b[j].is_ascii_digit() || b[j] == b'-')
            {
                j += 1;
            }
            flags.push(text[i..j].trim_end_matches('-').to_string());
            i = j;
        } else {
            i += 1;
        }
    }
    flags
}

/// The options `ferrotron ARGS --help` lists (the lines that start with a
/// dash: `  -h, --help`, `      --model <MODEL>`).
fn help_flags(args: &[&str]) -> BTreeSet<String> {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_ferrotron"));
    cmd.args(args).arg("--help");
    let out = deadline::output_within(&mut cmd, Duration::from_secs(120))
        .unwrap_or_else(|e| panic!("cannot run ferrotron {args:?} --help: {e}"));
    assert!(
        out.status.success(),
        "ferrotron {args:?} --help failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    let mut flags = BTreeSet::new();
    for line in text.lines() {
        // An option line is indented by 2 (`  -h, --help`) or 6 spaces
        // (`      --model <MODEL>`); its description follows after two
        // spaces or on lines indented further, which may quote flags too.
        let option = line.trim_start();
        if line.len() - option.len() >= 8 || !option.starts_with('-') {
            continue;
        }
        let option = option.split("  ").next().unwrap();
        for part in option.split(", ") {
            if let Some(flag) = part
                .split([' ', '='])
                .next()
                .filter(|f| f.starts_with("--"))
            {
                flags.insert(flag.to_string());
            }
        }
    }
    assert!(
        flags.contains("--help"),
        "ferrotron {args:?} --help lists no --help: the parser reads the wrong lines:\n{text}"
    );
    flags
}

fn all_cli_flags() -> BTreeSet<String> {
    SUBCOMMANDS
        .iter()
        .flat_map(|args| help_flags(args))
        .collect()
}

/// The lines of `text` with commands continued by a trailing `\` joined,
/// each with its first line number.
fn logical_lines(text: &str) -> Vec<(usize, String)> {
    let mut out: Vec<(usize, String)> = Vec::new();
    let mut continued = false;
    for (n, line) in text.lines().enumerate() {
        if continued {
            out.last_mut().unwrap().1.push_str(line);
        } else {
            out.push((n + 1, line.to_string()));
        }
        continued = line.trim_end().ends_with('\\');
    }
    out
}

fn is_table_row(line: &str) -> bool {
    line.trim_start().starts_with('|')
}

/// The header of the key table of docs/training.md.
const KEY_TABLE_HEADER: &str = "| key | flag | default | meaning |";

/// The rows of the key table of docs/training.md (the table under
/// [`KEY_TABLE_HEADER`]), split into cells.
fn key_rows(training: &str) -> Vec<Vec<String>> {
    let mut lines = training
        .lines()
        .skip_while(|l| l.trim() != KEY_TABLE_HEADER);
    assert!(
        lines.next().is_some(),
        "docs/training.md has no key table headed `{KEY_TABLE_HEADER}`"
    );
    lines
        .skip(1) // |---|---|
        .take_while(|l| is_table_row(l))
        .map(|l| {
            l.trim()
                .trim_matches('|')
                .split('|')
                .map(|c| c.trim().to_string())
                .collect()
        })
        .collect()
}

fn training_page() -> String {
    std::fs::read_to_string(repo_root().join("docs/training.md")).expect("docs/training.md")
}

/// The lines of `text` outside fenced code blocks, numbered from 1.
fn prose_lines(text: &str) -> Vec<(usize, &str)> {
    let mut fenced = false;
    let mut lines = Vec::new();
    for (n, line) in text.lines().enumerate() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
        } else if !fenced {
            lines.push((n + 1, line));
        }
    }
    lines
}

/// The targets of the inline Markdown links on `line` (`[text](target)`).
fn link_targets(line: &str) -> Vec<&str> {
    let mut targets = Vec::new();
    let mut rest = line;
    while let Some(at) = rest.find("](") {
        let after = &rest[at + 2..];
        let Some(end) = after.find(')') else { break };
        targets.push(after[..end].split_whitespace().next().unwrap_or(""));
        rest = &after[end..];
    }
    targets
}

/// The anchor a forge (GitHub, Gitea, GitLab) gives a heading's text:
/// link syntax reduced to the link's text, lowercase, every character but
/// letters, digits, `-`, `_` and spaces dropped, spaces as `-`.
fn heading_anchor(heading: &str) -> String {
    let mut text = String::new();
    let mut rest = heading;
    while let Some(at) = rest.find("](") {
        text.push_str(&rest[..at]);
        rest = rest[at..].find(')').map_or("", |end| &rest[at + end + 1..]);
    }
    text.push_str(rest);
    text.trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || matches!(c, '-' | '_' | ' '))
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// The anchors of `text`'s headings; a repeated heading's later anchors
/// gain `-1`, `-2`, ... as on a forge.
fn anchors(text: &str) -> BTreeSet<String> {
    let mut seen = std::collections::BTreeMap::<String, usize>::new();
    let mut out = BTreeSet::new();
    for (_, line) in prose_lines(text) {
        let hashes = line.len() - line.trim_start_matches('#').len();
        if !(1..=6).contains(&hashes) || !line[hashes..].starts_with(' ') {
            continue;
        }
        let anchor = heading_anchor(line[hashes..].trim_end_matches(['#', ' ']));
        let count = seen.entry(anchor.clone()).or_default();
        out.insert(match *count {
            0 => anchor,
            n => format!("{anchor}-{n}"),
        });
        *count += 1;
    }
    out
}

#[test]
fn every_relative_link_resolves() {
    let mut broken = Vec::new();
    for (path, text) in pages() {
        let dir = path.parent().unwrap();
        for (n, line) in prose_lines(&text) {
            for target in link_targets(line) {
                let external = ["http://", "https://", "mailto:"]
                    .iter()
                    .any(|p| target.starts_with(p));
                let (file, anchor) = target.split_once('#').unwrap_or((target, ""));
                let page = if file.is_empty() {
                    path.clone()
                } else {
                    dir.join(file)
                };
                let missing = if external || target.is_empty() {
                    false
                } else if !page.exists() {
                    true
                } else if !anchor.is_empty() && page.extension().is_some_and(|x| x == "md") {
                    let text = std::fs::read_to_string(&page).unwrap_or_default();
                    !anchors(&text).contains(anchor)
                } else {
                    false
                };
                if missing {
                    broken.push(format!("{}:{n}: {target}", name(&path)));
                }
            }
        }
    }
    assert!(
        broken.is_empty(),
        "links to missing files or headings:\n{}",
        broken.join("\n")
    );
}

#[test]
fn heading_anchors_are_the_forges() {
    let text = "# Kernels and backends\n```\n# not a heading\n```\n\
                ## Which implementation runs: `--kernels`\n\
                ### bf16 and fp16 with TP, PP and CP\n## On a lent GPU: `scripts/gpu_check.sh`\n\
                ## See [kernels](kernels.md)\n## Notes\n## Notes\n#hashtag\n";
    let expected = [
        "kernels-and-backends",
        "which-implementation-runs---kernels",
        "bf16-and-fp16-with-tp-pp-and-cp",
        "on-a-lent-gpu-scriptsgpu_checksh",
        "see-kernels",
        "notes",
        "notes-1",
    ];
    assert_eq!(
        anchors(text),
        expected.into_iter().map(String::from).collect()
    );
}

#[test]
fn every_flag_the_docs_name_exists() {
    let known = all_cli_flags();
    let training = repo_root().join("docs/training.md");
    let mut unknown = Vec::new();
    let mut checked = 0;
    for (path, text) in pages() {
        for (n, line) in logical_lines(&text) {
            let names_ferrotron = line.to_lowercase().contains("ferrotron");
            let key_table = path == training && is_table_row(&line);
            if !(names_ferrotron || key_table) {
                continue;
            }
            for flag in flags_in(&line) {
                checked += 1;
                if !known.contains(&flag) && !FOREIGN.contains(&flag.as_str()) {
                    unknown.push(format!("{}:{n}: {flag}", name(&path)));
                }
            }
        }
    }
    assert!(
        checked > 100,
        "only {checked} flags checked: is the scan broken?"
    );
    assert!(
        unknown.is_empty(),
        "flags no `ferrotron ... --help` lists (add them to FOREIGN only if they belong to another program):\n{}",
        unknown.join("\n")
    );
}

#[test]
fn every_train_flag_has_a_row_in_the_key_table() {
    let train = help_flags(&["train"]);
    let page = training_page();
    let rows = key_rows(&page);
    let documented: BTreeSet<String> = rows.iter().flat_map(|cells| flags_in(&cells[1])).collect();
    let missing: Vec<_> = train
        .iter()
        .filter(|f| !TRAIN_FLAGS_NOT_KEYS.contains(&f.as_str()) && !documented.contains(*f))
        .collect();
    assert!(
        missing.is_empty(),
        "`ferrotron train` flags without a row in docs/training.md's key table: {missing:?}"
    );
    for flag in TRAIN_FLAGS_NOT_KEYS.iter().filter(|f| **f != "--help") {
        assert!(
            page.contains(&format!("`{flag}")),
            "docs/training.md does not mention `ferrotron train {flag}`"
        );
    }
}

#[test]
fn each_key_row_names_one_known_section_key_and_a_train_flag() {
    let train = help_flags(&["train"]);
    let page = training_page();
    let rows = key_rows(&page);
    assert!(rows.len() > 40, "only {} key rows found", rows.len());
    let mut seen = BTreeSet::new();
    for cells in &rows {
        let key = cells[0].trim_matches('`');
        let (section, field) = key
            .split_once('.')
            .unwrap_or_else(|| panic!("docs/training.md: `{key}` is not section.key"));
        assert!(
            SECTIONS.contains(&section),
            "docs/training.md: `{key}`: unknown section [{section}]"
        );
        assert!(
            !field.is_empty()
                && field
                    .bytes()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'_'),
            "docs/training.md: `{key}`: a key is lowercase with underscores"
        );
        assert!(
            seen.insert(key.to_string()),
            "docs/training.md: `{key}` twice"
        );
        assert!(
            cells.len() >= 4,
            "docs/training.md: `{key}`: want key | flag | default | meaning"
        );
        let flags = flags_in(&cells[1]);
        assert!(
            flags.len() == 1 && train.contains(&flags[0]),
            "docs/training.md: `{key}`: the flag cell `{}` is not one `ferrotron train` flag",
            cells[1]
        );
    }
}

#[test]
fn training_keys_match_the_job_config() {
    let page = training_page();
    let documented: BTreeSet<String> = key_rows(&page)
        .iter()
        .map(|cells| cells[0].trim_matches('`').to_string())
        .collect();
    let keys = job_config_keys();
    let undocumented: Vec<_> = keys.difference(&documented).collect();
    let unknown: Vec<_> = documented.difference(&keys).collect();
    assert!(
        undocumented.is_empty() && unknown.is_empty(),
        "docs/training.md against JobConfig: keys not documented {undocumented:?}, documented keys JobConfig lacks {unknown:?}"
    );
}

#[test]
fn the_flag_scanner_reads_flags_and_nothing_else() {
    assert_eq!(
        flags_in(
            "`ferrotron train --pp 2 --pp-schedule interleaved` |---|---| a--b --X -- --mpi=pmix"
        ),
        ["--pp", "--pp-schedule", "--mpi"]
    );
    assert_eq!(
        logical_lines("a \\\n  --b\nc"),
        [(1, "a \\  --b".to_string()), (3, "c".to_string())]
    );
}
