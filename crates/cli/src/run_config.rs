//! `config.toml` of a run directory: the settings and the resolved model.

use std::path::Path;

use ferrotron_models::DecoderConfig;
use serde::{Deserialize, Serialize};

use crate::error::usage;
use crate::settings::TrainSettings;

/// Everything needed to rebuild a run's model and repeat the run.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunConfig {
    /// The training settings as resolved from defaults, file and flags.
    pub train: TrainSettings,
    /// The model architecture.
    pub model: DecoderConfig,
}

impl RunConfig {
    /// Reads `<run>/config.toml`.
    pub fn read(run: &Path) -> anyhow::Result<Self> {
        let path = run.join("config.toml");
        let text = std::fs::read_to_string(&path).map_err(|e| {
            usage(format!(
                "--run {}: cannot read {}: {e}",
                run.display(),
                path.display()
            ))
        })?;
        toml::from_str(&text)
            .map_err(|e| usage(format!("{}: {}", path.display(), e.message().trim())))
    }
}
