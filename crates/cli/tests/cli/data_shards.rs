//! Token shards: `ferrotron data prepare`, `data verify` and `ferrotron
//! train --data`. Training on shards equals training on the same tokens in
//! memory; a `--data` run resumes exactly and refuses another shard set;
//! damaged shards (checksums), ids outside the vocabulary and bad inputs
//! are refused before anything is written; a resumed run refuses a corpus
//! whose text changed, and a tokenizer larger than the model is refused.

use std::io::Write;
use std::path::Path;
use std::process::Output;
use std::time::Duration;

use ferrotron_engine::data::{encode, xxh3_64_hex, ShardSet, TokenSource, Tokenizer};

use crate::common;

use common::{copy_dir, corpus, records, scratch, step_losses};

/// Longest a command of these tests may take before it is killed and fails.
const DEADLINE: Duration = Duration::from_secs(300);

fn ferrotron(args: &[&str]) -> Output {
    common::ferrotron_within(args, DEADLINE)
}

fn ok(o: &Output, what: &str) -> String {
    let stdout = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(
        o.status.success(),
        "{what}:\n{stdout}\n{}",
        String::from_utf8_lossy(&o.stderr)
    );
    stdout
}

/// Asserts exit code 2 and a one-line error holding every needle.
fn refused(o: &Output, needles: &[&str]) {
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    for n in needles {
        assert!(err.contains(n), "'{err}' lacks '{n}'");
    }
}

/// `ferrotron train` flags of every run here: a tiny GPT, `steps` steps.
fn train_args(steps: usize) -> Vec<String> {
    [
        "train",
        "--model",
        "gpt-mini",
        "--seq-len",
        "32",
        "--micro-batch",
        "2",
        "--eval-every",
        "3",
        "--eval-batches",
        "2",
        "--sample-tokens",
        "0",
        "--peak-tflops",
        "1",
    ]
    .iter()
    .map(|s| s.to_string())
    .chain(["--steps".into(), steps.to_string()])
    .collect()
}

fn run(mut args: Vec<String>, extra: &[&str]) -> Output {
    args.extend(extra.iter().map(|s| s.to_string()));
    let all: Vec<&str> = args.iter().map(String::as_str).collect();
    ferrotron(&all)
}

/// `(step, val_loss)` of every validation record of a run.
fn val_losses(run: &Path) -> Vec<(u64, f64)> {
    records(run)
        .iter()
        .filter_map(|v| Some((v["step"].as_u64()?, v.get("val_loss")?.as_f64()?)))
        .collect()
}

#[test]
fn training_on_shards_equals_training_on_the_same_tokens_in_memory() {
    let dir = scratch("shards-equal");
    let corpus = corpus(&dir);
    let c = corpus.to_str().unwrap();
    let shards = dir.join("shards");
    // Shards of 1000 tokens, so training windows cross shard boundaries.
    let o = ferrotron(&[
        "data",
        "prepare",
        "--input",
        c,
        "--vocab-size",
        "300",
        "--shard-tokens",
        "1000",
        "--out",
        shards.to_str().unwrap(),
    ]);
    let stdout = ok(&o, "data prepare");
    assert!(
        stdout.contains("MB/s") && stdout.contains("1 documents"),
        "{stdout}"
    );
    let index: serde_json::Value =
        serde_json::from_slice(&std::fs::read(shards.join("index.json")).unwrap()).unwrap();
    assert_eq!(index["dtype"], "u16");
    assert_eq!(index["vocab_size"], 300);
    assert_eq!(index["documents"], 1);
    assert!(index["shards"].as_array().unwrap().len() >= 3, "{index}");
    // Nothing but the set beside the corpus (no temporary directory left).
    assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 2);

    let on_shards = dir.join("on-shards");
    let in_memory = dir.join("in-memory");
    ok(
        &run(
            train_args(6),
            &[
                "--data",
                shards.to_str().unwrap(),
                "--out",
                on_shards.to_str().unwrap(),
            ],
        ),
        "train --data",
    );
    ok(
        &run(
            train_args(6),
            &[
                "--corpus",
                c,
                "--vocab-size",
                "300",
                "--out",
                in_memory.to_str().unwrap(),
            ],
        ),
        "train --corpus",
    );
    // The same tokenizer, tokens, split and windows: the same losses, exactly.
    assert_eq!(
        std::fs::read(on_shards.join("tokenizer.json")).unwrap(),
        std::fs::read(in_memory.join("tokenizer.json")).unwrap()
    );
    let losses = step_losses(&on_shards);
    assert_eq!(losses.len(), 6);
    assert_eq!(losses, step_losses(&in_memory));
    assert_eq!(val_losses(&on_shards).len(), 3);
    assert_eq!(val_losses(&on_shards), val_losses(&in_memory));
    // The run records the shard set it trained on.
    let config = std::fs::read_to_string(on_shards.join("run.toml")).unwrap();
    assert!(
        config.contains("[shards]") && config.contains("index_sha256"),
        "{config}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_data_run_resumes_exactly_and_refuses_another_shard_set() {
    let dir = scratch("shards-resume");
    let corpus = corpus(&dir);
    let prepare = |out: &Path, shard_tokens: &str| {
        ok(
            &ferrotron(&[
                "data",
                "prepare",
                "--input",
                corpus.to_str().unwrap(),
                "--vocab-size",
                "300",
                "--shard-tokens",
                shard_tokens,
                "--out",
                out.to_str().unwrap(),
            ]),
            "data prepare",
        );
    };
    let shards = dir.join("shards");
    prepare(&shards, "1500");
    let whole = dir.join("whole");
    ok(
        &run(
            train_args(6),
            &[
                "--data",
                shards.to_str().unwrap(),
                "--save-every",
                "3",
                "--out",
                whole.to_str().unwrap(),
            ],
        ),
        "the 6-step run",
    );
    let copy = dir.join("copy");
    copy_dir(&whole, &copy);
    let from = copy.join("checkpoints").join("step-3");
    ok(
        &ferrotron(&["train", "--resume", from.to_str().unwrap()]),
        "the resumed run",
    );
    let (a, b) = (step_losses(&whole), step_losses(&copy));
    assert_eq!(a.len(), 6);
    assert_eq!(b, a, "steps 4-6 resumed from step 3, recorded once");

    // The same directory now holding another shard set (other shard sizes:
    // another index) is refused, naming the file that differs.
    let other = dir.join("other");
    prepare(&other, "700");
    std::fs::remove_dir_all(&shards).unwrap();
    std::fs::rename(&other, &shards).unwrap();
    let before = std::fs::read(copy.join("metrics.jsonl")).unwrap();
    let o = ferrotron(&["train", "--resume", copy.to_str().unwrap()]);
    refused(&o, &["index.json", "SHA-256", "keeps its data"]);
    assert_eq!(std::fs::read(copy.join("metrics.jsonl")).unwrap(), before);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn json_lines_gzip_and_globs_with_a_given_tokenizer() {
    let dir = scratch("shards-jsonl");
    let inputs = dir.join("in");
    std::fs::create_dir_all(&inputs).unwrap();
    let docs: Vec<String> = (0..30)
        .map(|i| {
            format!(
                "Document {i}: the quick brown fox {}.\nSecond line.",
                i * 7 % 11
            )
        })
        .collect();
    let line = |d: &String| format!("{}\n", serde_json::json!({"id": 1, "text": d}));
    // The first 20 documents plain, the rest gzip-compressed: the glob sorts
    // `a.jsonl` before `b.jsonl.gz`.
    let plain: String = docs[..20].iter().map(line).collect();
    std::fs::write(inputs.join("a.jsonl"), plain).unwrap();
    let gz = std::fs::File::create(inputs.join("b.jsonl.gz")).unwrap();
    let mut enc = flate2::write::GzEncoder::new(gz, flate2::Compression::fast());
    let rest: String = docs[20..].iter().map(line).collect();
    enc.write_all(rest.as_bytes()).unwrap();
    enc.finish().unwrap();
    // A tokenizer made by a first preparation.
    let corpus = corpus(&dir);
    let first = dir.join("first");
    ok(
        &ferrotron(&[
            "data",
            "prepare",
            "--input",
            corpus.to_str().unwrap(),
            "--vocab-size",
            "280",
            "--out",
            first.to_str().unwrap(),
        ]),
        "the tokenizer",
    );
    let tok_path = first.join("tokenizer.json");
    let shards = dir.join("shards");
    let pattern = format!("{}/*.jsonl*", inputs.display());
    ok(
        &ferrotron(&[
            "data",
            "prepare",
            "--input",
            &pattern,
            "--text-field",
            "text",
            "--tokenizer",
            tok_path.to_str().unwrap(),
            "--shard-tokens",
            "100",
            "--out",
            shards.to_str().unwrap(),
        ]),
        "data prepare of JSON lines",
    );
    // The stream is the documents' tokens separated by <|endoftext|> (id 0).
    let tokenizer = Tokenizer::from_file(&tok_path).unwrap();
    let mut expected = Vec::new();
    for d in &docs {
        if !expected.is_empty() {
            expected.push(0);
        }
        expected.extend(encode(&tokenizer, d).unwrap());
    }
    let set = ShardSet::open(&shards).unwrap();
    assert_eq!(set.index().documents, 30);
    assert_eq!(set.index().eos_id, Some(0));
    let mut got = vec![0; set.len()];
    set.read(0, &mut got);
    assert_eq!(got, expected);
    assert_eq!(
        std::fs::read(shards.join("tokenizer.json")).unwrap(),
        std::fs::read(&tok_path).unwrap(),
        "the tokenizer is copied byte for byte"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn bad_inputs_and_damaged_shards_are_refused_before_anything_is_written() {
    let dir = scratch("shards-refuse");
    let corpus = corpus(&dir);
    let c = corpus.to_str().unwrap();
    let out = dir.join("out");
    let o = out.to_str().unwrap();
    let prepare_into = |out: &str, extra: &[&str]| {
        let mut args = vec!["data", "prepare", "--out", out];
        args.extend(extra);
        ferrotron(&args)
    };
    let prepare = |extra: &[&str]| prepare_into(o, extra);
    refused(&prepare(&["--input", c]), &["--tokenizer", "--vocab-size"]);
    refused(
        &prepare(&["--input", "/nonexistent/x.txt", "--vocab-size", "300"]),
        &["/nonexistent/x.txt"],
    );
    refused(
        &prepare(&["--input", "/nonexistent/*.txt", "--vocab-size", "300"]),
        &["matches no file"],
    );
    refused(
        &prepare(&["--input", c, "--vocab-size", "100"]),
        &["--vocab-size"],
    );
    let bad = dir.join("bad.jsonl");
    for (second_line, needle) in [
        (&b"{\"body\": \"no text\"}"[..], "no field `text`"),
        (&b"{\"text\": \"\xff\"}"[..], "not UTF-8"),
    ] {
        std::fs::write(
            &bad,
            [&b"{\"text\": \"fine\"}\n"[..], second_line, b"\n"].concat(),
        )
        .unwrap();
        refused(
            &prepare(&[
                "--input",
                bad.to_str().unwrap(),
                "--text-field",
                "text",
                "--vocab-size",
                "257",
            ]),
            &["bad.jsonl:2", needle],
        );
    }
    let not_gzip = dir.join("text.txt.gz");
    std::fs::write(&not_gzip, "plain text, not gzip\n").unwrap();
    refused(
        &prepare(&["--input", not_gzip.to_str().unwrap(), "--vocab-size", "257"]),
        &["text.txt.gz"],
    );
    let under_a_file = corpus.join("sub");
    refused(
        &prepare_into(
            under_a_file.to_str().unwrap(),
            &["--input", c, "--vocab-size", "300"],
        ),
        &["--out", "is not a directory"],
    );
    std::fs::remove_file(&not_gzip).unwrap();
    assert!(!out.exists());
    // No temporary directory left beside the corpus either.
    assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 2);

    let shards = dir.join("shards");
    let s = shards.to_str().unwrap();
    ok(
        &prepare_into(
            s,
            &[
                "--input",
                c,
                "--vocab-size",
                "300",
                "--shard-tokens",
                "1000",
            ],
        ),
        "data prepare",
    );
    refused(
        &prepare_into(s, &["--input", c, "--vocab-size", "300"]),
        &["--out", "not an empty directory"],
    );
    let train = |extra: &[&str]| run(train_args(2), &[&["--out", o], extra].concat());
    refused(
        &train(&["--data", s, "--corpus", c]),
        &["--data with --corpus"],
    );
    refused(
        &train(&["--data", s, "--vocab-size", "257"]),
        &["its tokenizer has 300 tokens", "vocabulary of 257"],
    );
    refused(
        &train(&["--data", s, "--val-fraction", "0.001"]),
        &["--data", "val split would have"],
    );
    // A truncated shard, then a foreign one.
    let shard = shards.join("shard-00001.bin");
    let good = std::fs::read(&shard).unwrap();
    std::fs::write(&shard, &good[..good.len() - 2]).unwrap();
    refused(&train(&["--data", s]), &["shard-00001.bin", "truncated"]);
    let mut foreign = good.clone();
    foreign[..8].copy_from_slice(b"GGUF\0\0\0\0");
    std::fs::write(&shard, &foreign).unwrap();
    refused(&train(&["--data", s]), &["shard-00001.bin", "bad magic"]);
    assert!(!out.exists(), "a refused run wrote {}", out.display());
    let _ = std::fs::remove_dir_all(&dir);
}

/// `data prepare` of `corpus` into `out`: vocabulary `vocab`, shards of
/// `shard_tokens` tokens.
fn prepare(corpus: &Path, vocab: &str, shard_tokens: &str, out: &Path) {
    ok(
        &ferrotron(&[
            "data",
            "prepare",
            "--input",
            corpus.to_str().unwrap(),
            "--vocab-size",
            vocab,
            "--shard-tokens",
            shard_tokens,
            "--out",
            out.to_str().unwrap(),
        ]),
        "data prepare",
    );
}

/// Writes `bytes` as `shard` of the set in `dir` and its checksum into
/// `index.json`, as a tool that wrote the set itself would (or none, as
/// an index from before checksums).
fn rewrite_shard(dir: &Path, shard: usize, bytes: &[u8], checksum: bool) {
    std::fs::write(dir.join(format!("shard-{shard:05}.bin")), bytes).unwrap();
    let path = dir.join("index.json");
    let mut index: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    let entry = index["shards"][shard].as_object_mut().unwrap();
    match checksum {
        true => entry.insert("xxh3_64".into(), xxh3_64_hex(bytes).into()),
        false => entry.remove("xxh3_64"),
    };
    std::fs::write(&path, serde_json::to_vec_pretty(&index).unwrap()).unwrap();
}

#[test]
fn data_verify_and_train_refuse_a_damaged_shard_and_an_id_outside_the_vocabulary() {
    let dir = scratch("shards-verify");
    let corpus = corpus(&dir);
    let shards = dir.join("shards");
    prepare(&corpus, "300", "1000", &shards);
    let s = shards.to_str().unwrap();
    let o = ferrotron(&["data", "verify", s]);
    let stdout = ok(&o, "data verify of a good set");
    let n = ShardSet::open(&shards).unwrap().index().shards.len();
    assert!(
        stdout.contains(&format!("{n} shard(s)"))
            && stdout.contains("every checksum matches index.json")
            && stdout.contains("below the vocabulary of 300"),
        "{stdout}"
    );

    let out = dir.join("out");
    let train = || {
        run(
            train_args(2),
            &["--data", s, "--out", out.to_str().unwrap()],
        )
    };
    let shard = shards.join("shard-00001.bin");
    let good = std::fs::read(&shard).unwrap();
    // One token changed, the size kept: only the checksum can tell.
    let mut damaged = good.clone();
    damaged[32 + 2 * 500] ^= 1;
    std::fs::write(&shard, &damaged).unwrap();
    for o in [ferrotron(&["data", "verify", s]), train()] {
        refused(&o, &["shard-00001.bin", "XXH3-64", "damaged"]);
    }
    // Token 500 of the shard is 300 (outside the tokenizer's 300 ids), the
    // checksum the file's: named with its shard and offset.
    let mut outside = good.clone();
    outside[32 + 2 * 500..32 + 2 * 501].copy_from_slice(&300u16.to_le_bytes());
    rewrite_shard(&shards, 1, &outside, true);
    for o in [ferrotron(&["data", "verify", s]), train()] {
        refused(
            &o,
            &[
                "token id 300",
                "shard-00001.bin, token 500 of the shard (byte 1032)",
                "vocabulary of 300 tokens",
            ],
        );
    }
    // An index from before checksums: refused, saying how to remake it.
    rewrite_shard(&shards, 1, &good, false);
    for o in [ferrotron(&["data", "verify", s]), train()] {
        refused(
            &o,
            &[
                "index.json",
                "no checksum for shard-00001.bin",
                "data prepare",
            ],
        );
    }
    assert!(!out.exists(), "a refused run wrote {}", out.display());
    rewrite_shard(&shards, 1, &good, true);
    ok(&ferrotron(&["data", "verify", s]), "the set restored");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_resume_refuses_a_changed_corpus_and_a_tokenizer_larger_than_the_model() {
    let dir = scratch("corpus-resume");
    let corpus = corpus(&dir);
    let c = corpus.to_str().unwrap();
    let run_dir = dir.join("run");
    let r = run_dir.to_str().unwrap();
    ok(
        &run(
            train_args(2),
            &["--corpus", c, "--vocab-size", "300", "--out", r],
        ),
        "the 2-step run",
    );
    let record = std::fs::read_to_string(run_dir.join("run.toml")).unwrap();
    assert!(record.contains("corpus_sha256"), "{record}");
    let before = std::fs::read(run_dir.join("metrics.jsonl")).unwrap();
    let resume = || {
        ferrotron(&[
            "train",
            "--resume",
            r,
            "--steps",
            "3",
            "--override",
            "schedule.steps",
        ])
    };

    // The same path, other text.
    let text = std::fs::read_to_string(&corpus).unwrap();
    std::fs::write(&corpus, text.replace("lazy", "sleepy")).unwrap();
    refused(
        &resume(),
        &["data.corpus", "small.txt", "SHA-256", "keeps its data"],
    );
    std::fs::write(&corpus, &text).unwrap();

    // The run's tokenizer with 100 more tokens (400), for a model of 300.
    let tokenizer = run_dir.join("tokenizer.json");
    let kept = std::fs::read(&tokenizer).unwrap();
    let mut json: serde_json::Value = serde_json::from_slice(&kept).unwrap();
    let vocab = json["model"]["vocab"].as_object_mut().unwrap();
    assert_eq!(vocab.len(), 300);
    for id in 300..400 {
        vocab.insert(format!("extra{id}"), id.into());
    }
    std::fs::write(&tokenizer, serde_json::to_vec(&json).unwrap()).unwrap();
    refused(
        &resume(),
        &[
            "--resume",
            "tokenizer.json",
            "400 tokens",
            "the run's model of 300",
        ],
    );
    std::fs::write(&tokenizer, kept).unwrap();
    assert_eq!(
        std::fs::read(run_dir.join("metrics.jsonl")).unwrap(),
        before
    );
    ok(&resume(), "the resume with the run's corpus and tokenizer");
    assert_eq!(step_losses(&run_dir).len(), 3);

    // A Hugging Face directory whose tokenizer.json (20 tokens) grows past
    // its config.json's vocab_size (96): refused before anything is written.
    let fixture =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../models/tests/fixtures/hf/gpt2/model");
    let hf = dir.join("hf");
    copy_dir(&fixture, &hf);
    let path = hf.join("tokenizer.json");
    let mut json: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    let vocab = json["model"]["vocab"].as_object_mut().unwrap();
    for id in vocab.len()..100 {
        vocab.insert(format!("extra{id}"), id.into());
    }
    let grown = serde_json::to_vec(&json).unwrap();
    std::fs::write(&path, &grown).unwrap();
    let out = dir.join("hf-run");
    let train_hf = |data: &[&str]| {
        let mut args = vec!["train", "--hf-dir", hf.to_str().unwrap()];
        args.extend(data);
        args.extend(["--seq-len", "16", "--steps", "1", "--out"]);
        args.push(out.to_str().unwrap());
        ferrotron(&args)
    };
    refused(
        &train_hf(&["--corpus", c]),
        &[
            "model.hf_dir",
            "tokenizer.json",
            "100 tokens",
            "vocab_size of 96",
        ],
    );
    // Without its tokenizer.json, the model would train on the ids of a
    // tokenizer trained on the corpus.
    std::fs::remove_file(&path).unwrap();
    refused(
        &train_hf(&["--corpus", c]),
        &["model.hf_dir", "has no tokenizer.json"],
    );
    // Shards made with a tokenizer other than the model's (its own with
    // one token more, still within the model's vocabulary).
    let own = std::fs::read(fixture.join("tokenizer.json")).unwrap();
    std::fs::write(&path, &own).unwrap();
    let mut json: serde_json::Value = serde_json::from_slice(&own).unwrap();
    let vocab = json["model"]["vocab"].as_object_mut().unwrap();
    vocab.insert("extra".into(), vocab.len().into());
    let other = dir.join("other-tokenizer.json");
    std::fs::write(&other, serde_json::to_vec(&json).unwrap()).unwrap();
    let other_set = dir.join("other-set");
    ok(
        &ferrotron(&[
            "data",
            "prepare",
            "--input",
            c,
            "--tokenizer",
            other.to_str().unwrap(),
            "--out",
            other_set.to_str().unwrap(),
        ]),
        "data prepare with another tokenizer",
    );
    refused(
        &train_hf(&["--data", other_set.to_str().unwrap()]),
        &["data.shards", "another tokenizer", "tokenizer.json"],
    );
    assert!(!out.exists(), "a refused run wrote {}", out.display());
    let _ = std::fs::remove_dir_all(&dir);
}
