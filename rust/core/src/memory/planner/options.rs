//! The planner's named options, parsed once: recomputation modes and pipeline split rules.

use crate::error::{Error, Result};
use crate::memory::layout::Recompute;
use crate::memory::options::Choice;
use crate::memory::pipeline::PipelineSplit;

/// The modes `names` name, in order, each once; at least one.
pub fn recompute_modes<S: AsRef<str>>(names: &[S]) -> Result<Vec<Recompute>> {
    let mut modes: Vec<Recompute> = Vec::new();
    for name in names {
        let mode: Recompute = name.as_ref().parse()?;
        if !modes.contains(&mode) {
            modes.push(mode);
        }
    }
    if modes.is_empty() {
        return Err(Error::invalid("recompute must name at least one mode"));
    }
    Ok(modes)
}

impl PipelineSplit {
    /// The name `pipeline_split` takes for this rule.
    pub fn name(self) -> &'static str {
        let found = Self::CHOICES.iter().find(|(_, split, _)| *split == self);
        found.map_or("even", |(name, ..)| name)
    }
}
