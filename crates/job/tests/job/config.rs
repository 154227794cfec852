//! The job file and the flags: sections, misplaced and old flat keys,
//! the printed configuration read back, flags over the file.

use ferrotron_job::config::*;
use ferrotron_job::JobConfig;

fn problems(text: &str) -> Vec<String> {
    JobConfig::from_toml_str(text, "job.toml")
        .unwrap_err()
        .iter()
        .map(ToString::to_string)
        .collect()
}

#[test]
fn a_sectioned_file_sets_its_keys_and_leaves_the_rest_default() {
    let job = JobConfig::from_toml_str(
        "[model]\nname = \"llama-mini\"\n[parallelism]\ntp = 2\nzero = 1\npp_layers = [3, 1]\n",
        "job.toml",
    )
    .unwrap();
    assert_eq!(job.model.name, "llama-mini");
    assert_eq!(job.parallelism.tp, 2);
    assert_eq!(
        job.parallelism.zero,
        ferrotron_parallel::zero::ZeroStage::One
    );
    assert_eq!(job.parallelism.pp_layers, Some(vec![3, 1]));
    assert_eq!(job.schedule, ScheduleSection::default());
}

#[test]
fn printed_config_reads_back_identical() {
    let mut job = JobConfig::default();
    job.optimizer.lr = 3.1e-4;
    job.optimizer.eps = 1e-8;
    job.parallelism.sp = true;
    job.parallelism.recompute = Some(ferrotron_parallel::recompute::Recompute::Selective);
    job.precision.compute = Some(ferrotron_engine::precision::Precision::Bf16);
    job.checkpoint.out = Some("runs/x".into());
    job.parallelism.pp_schedule = PpSchedule::Interleaved;
    let text = job.to_toml();
    assert_eq!(
        JobConfig::from_toml_str(&text, "printed").unwrap(),
        job,
        "{text}"
    );
}

#[test]
fn an_old_flat_key_names_the_section_it_moved_to() {
    let p = problems("steps = 3\nlr = 0.1\n");
    assert_eq!(p.len(), 2, "{p:?}");
    assert!(
        p[0].contains("'lr'") && p[0].contains("[optimizer]") && p[0].contains("optimizer.lr"),
        "{p:?}"
    );
    assert!(p[1].contains("schedule.steps"), "{p:?}");
    assert!(p.iter().all(|l| l.starts_with("job.toml: ")), "{p:?}");
}

#[test]
fn a_key_in_the_wrong_section_names_its_section() {
    let p = problems("[optimizer]\nsteps = 3\n");
    assert!(
        p[0].contains("[optimizer] has no key 'steps'") && p[0].contains("[schedule]"),
        "{p:?}"
    );
}

#[test]
fn unknown_keys_and_bad_types_are_all_reported() {
    let p = problems(
        "[optimizer]\nlearning_rate = 0.1\n[schedule]\nsteps = \"many\"\n[nonsense]\nx = 1\n",
    );
    assert_eq!(p.len(), 3, "{p:?}");
    assert!(
        p.iter()
            .any(|l| l.contains("learning_rate") && l.contains("lr, min_lr")),
        "{p:?}"
    );
    assert!(
        p.iter().any(|l| l.contains("schedule.steps (--steps)")),
        "{p:?}"
    );
    assert!(
        p.iter()
            .any(|l| l.contains("'nonsense'") && l.contains("parallelism")),
        "{p:?}"
    );
}

#[test]
fn a_section_written_as_a_value_is_refused() {
    let p = problems("model = \"llama-mini\"\n");
    assert!(
        p[0].contains("'model' is a section") && p[0].contains("name"),
        "{p:?}"
    );
}

#[test]
fn flags_override_the_file_and_report_what_they_set() {
    use clap::Parser;
    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        flags: JobFlags,
    }
    let cli = Cli::parse_from([
        "x",
        "--lr",
        "0.5",
        "--sp",
        "--pp-layers",
        "3,1",
        "--comm-timeout",
        "9",
        "--data",
        "d",
    ]);
    let mut job = JobConfig::default();
    let set: Vec<String> = cli.flags.apply(&mut job).iter().map(|k| k.path()).collect();
    assert_eq!(job.optimizer.lr, 0.5);
    assert!(job.parallelism.sp);
    assert_eq!(job.parallelism.pp_layers, Some(vec![3, 1]));
    assert_eq!(job.parallelism.comm_timeout_s, 9.0);
    assert_eq!(job.data.shards, Some("d".into()));
    assert_eq!(
        set,
        [
            "data.shards",
            "optimizer.lr",
            "parallelism.sp",
            "parallelism.pp_layers",
            "parallelism.comm_timeout_s"
        ]
    );
}

#[test]
fn every_key_has_a_distinct_flag() {
    let mut flags: Vec<String> = KEYS.iter().map(Key::flag).collect();
    flags.sort();
    let n = flags.len();
    flags.dedup();
    assert_eq!(flags.len(), n);
}

#[test]
fn changes_lists_the_keys_that_differ_with_both_values() {
    let was = JobConfig::default();
    let mut now = was.clone();
    now.optimizer.lr = 1e-3;
    now.parallelism.dp = Some(2);
    now.backend.kernels = Some(ferrotron_models::Kernels::Reference);
    let changes = now.changes(&was);
    let got: Vec<(String, String, String)> = changes
        .iter()
        .map(|c| (c.key.path(), c.was_text(), c.now_text()))
        .collect();
    assert_eq!(
        got,
        [
            ("optimizer.lr".into(), "0.002".into(), "0.001".into()),
            ("parallelism.dp".into(), "unset".into(), "2".into()),
            ("backend.kernels".into(), "unset".into(), "reference".into()),
        ]
    );
    assert!(was.changes(&was).is_empty());
}

/// docs/checkpoints.md's table of what may change on `--resume` lists each
/// key (by itself or by its `[section]`) in the row of its class, as
/// `on_resume` decides it, and every key is listed.
#[test]
fn the_resume_classes_in_the_docs_are_those_of_on_resume() {
    use ferrotron_job::{on_resume, OnResume, KEYS};
    let page = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/checkpoints.md"),
    )
    .unwrap();
    let row = |class: &str| -> Vec<String> {
        let line = page
            .lines()
            .find(|l| l.starts_with(&format!("| {class} |")))
            .unwrap_or_else(|| panic!("docs/checkpoints.md has no '| {class} |' row"));
        let keys = line.split('|').nth(2).unwrap();
        keys.split('`')
            .skip(1)
            .step_by(2)
            .map(str::to_string)
            .collect()
    };
    let rows = [
        (OnResume::Free, row("free")),
        (OnResume::Override, row("override")),
        (OnResume::Kept, row("kept")),
    ];
    for key in KEYS {
        let listed: Vec<OnResume> = rows
            .iter()
            .filter(|(_, names)| {
                names.contains(&key.path()) || names.contains(&format!("[{}]", key.section))
            })
            .map(|(class, _)| *class)
            .collect();
        assert_eq!(
            listed,
            [on_resume(key)],
            "{}: docs/checkpoints.md lists it under {listed:?}",
            key.path()
        );
    }
}
