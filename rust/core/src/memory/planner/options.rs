//! The planner's named options, parsed once: recomputation modes and pipeline split rules.

use crate::error::{Error, Result};
use crate::memory::layout::Recompute;
use crate::memory::options::{Choice, RECOMPUTE_MODES, RECOMPUTE_MODULES};
use crate::memory::pipeline::PipelineSplit;

/// The modes `names` name, in order, each once; at least one.
pub fn recompute_modes<S: AsRef<str>>(names: &[S]) -> Result<Vec<Recompute>> {
    let mut modes: Vec<Recompute> = Vec::new();
    for name in names {
        let name = name.as_ref();
        let mode: Recompute = name.parse().map_err(|_| unknown_mode(name))?;
        if !modes.contains(&mode) {
            modes.push(mode);
        }
    }
    if modes.is_empty() {
        return Err(Error::invalid("recompute must name at least one mode"));
    }
    Ok(modes)
}

/// The planner's error for a name that is no recompute mode: the modes it lists, unquoted.
fn unknown_mode(name: &str) -> Error {
    let modes: Vec<&str> = RECOMPUTE_MODES.iter().map(|(mode, _)| *mode).collect();
    let modules: Vec<&str> = RECOMPUTE_MODULES
        .iter()
        .map(|(module, _)| *module)
        .collect();
    Error::invalid(format!(
        "recompute modes must be {} or Megatron-Core modules ({}) joined with '+', got '{name}'",
        modes.join(", "),
        modules.join(", ")
    ))
}

impl PipelineSplit {
    /// The name `pipeline_split` takes for this rule.
    pub fn name(self) -> &'static str {
        let found = Self::CHOICES.iter().find(|(_, split, _)| *split == self);
        found.map_or("even", |(name, ..)| name)
    }
}
