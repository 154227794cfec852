//! `ferrotron data verify DIR`: reads every shard of a set once, as `train
//! --data` does when it opens the set, with a progress bar over the bytes,
//! and prints what was checked.

use std::path::Path;
use std::time::Instant;

use ferrotron_engine::data::ShardSet;
use indicatif::{ProgressBar, ProgressStyle};

use crate::error::usage;

/// Checks the shard set in `dir`: its tokenizer's hash, then each shard's
/// header, size, XXH3-64 and ids against `index.json`. Any difference is
/// a usage error (exit 2) naming the file.
pub fn verify(dir: &Path) -> anyhow::Result<()> {
    let bar = ProgressBar::new(0);
    bar.set_style(
        ProgressStyle::with_template(
            "verify {bar:30} {bytes}/{total_bytes} ({bytes_per_sec}, ETA {eta})",
        )
        .expect("the progress template is valid"),
    );
    let t0 = Instant::now();
    let set = ShardSet::open_with_progress(dir, &mut |done, total| {
        bar.set_length(total);
        bar.set_position(done);
    });
    bar.finish_and_clear();
    let set = set.map_err(|e| usage(format!("data verify {}: {e}", dir.display())))?;
    let secs = t0.elapsed().as_secs_f64();
    let index = set.index();
    let mb = index.shard_bytes() as f64 / 1e6;
    println!(
        "{}: {} shard(s), {} tokens, {mb:.1} MB checked in {secs:.1} s ({:.0} MB/s): every checksum matches index.json and every id is below the vocabulary of {}",
        dir.display(),
        index.shards.len(),
        index.tokens,
        mb / secs.max(1e-9),
        index.vocab_size
    );
    Ok(())
}
