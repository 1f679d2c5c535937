//! The planner's named options, parsed once: recomputation modes and pipeline split rules.

use std::str::FromStr;

use crate::error::{Error, Result};
use crate::memory::layout::{Modules, Recompute};
use crate::memory::pipeline::PipelineSplit;

/// The plain recomputation modes, by name and code.
const MODES: [(&str, u8); 3] = [("none", 0), ("selective", 1), ("full", 2)];

/// Megatron-Core's `recompute_modules`, by name and bit.
const MODULES: [(&str, u8); 7] = [
    ("core_attn", Modules::CORE_ATTN),
    ("mlp", Modules::MLP),
    ("layernorm", Modules::LAYERNORM),
    ("moe", Modules::MOE),
    ("shared_experts", Modules::SHARED_EXPERTS),
    ("mla_up_proj", Modules::MLA_UP_PROJ),
    ("moe_act", Modules::MOE_ACT),
];

/// A set of modules is coded 2 plus its bits, so that `core_attn` alone is 3.
const SET_BASE: u8 = 2;

fn choices() -> String {
    let modes: Vec<&str> = MODES.iter().map(|(name, _)| *name).collect();
    let modules: Vec<&str> = MODULES.iter().map(|(name, _)| *name).collect();
    format!(
        "{} or Megatron-Core modules ({}) joined with '+'",
        modes.join(", "),
        modules.join(", ")
    )
}

impl FromStr for Recompute {
    type Err = Error;

    /// A mode name, or module names joined with `+` in any order, in any case.
    fn from_str(name: &str) -> Result<Self> {
        let lower = name.to_lowercase();
        if let Some(&(_, code)) = MODES.iter().find(|(mode, _)| *mode == lower) {
            return Ok(Recompute::from_code(f64::from(code)));
        }
        let mut bits = 0u8;
        for part in lower.split('+') {
            match MODULES.iter().find(|(module, _)| *module == part) {
                Some(&(_, bit)) => bits |= bit,
                None => {
                    return Err(Error::invalid(format!(
                        "recompute modes must be {}, got '{name}'",
                        choices()
                    )))
                }
            }
        }
        Ok(Recompute::from_code(f64::from(SET_BASE + bits)))
    }
}

impl Recompute {
    /// The `recompute` code of the layout field.
    pub fn code(self) -> f64 {
        match self {
            Recompute::None => 0.0,
            Recompute::Selective => 1.0,
            Recompute::Full => 2.0,
            Recompute::Modules(modules) => {
                let bits = MODULES
                    .iter()
                    .filter(|(_, bit)| modules.has(*bit))
                    .fold(0u8, |bits, (_, bit)| bits | bit);
                f64::from(SET_BASE + bits)
            }
        }
    }

    /// The mode's name: a mode, or its modules in Megatron-Core's order joined with `+`.
    pub fn name(self) -> String {
        match self {
            Recompute::None => "none".into(),
            Recompute::Selective => "selective".into(),
            Recompute::Full => "full".into(),
            Recompute::Modules(modules) => MODULES
                .iter()
                .filter(|(_, bit)| modules.has(*bit))
                .map(|(name, _)| *name)
                .collect::<Vec<_>>()
                .join("+"),
        }
    }
}

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

/// The split rules the planner chooses among, in the order of their codes.
const SPLITS: [(&str, PipelineSplit); 5] = [
    ("even", PipelineSplit::Even),
    ("auto", PipelineSplit::Auto),
    ("embedding", PipelineSplit::Embedding),
    ("loss", PipelineSplit::Loss),
    ("embedding_and_loss", PipelineSplit::EmbeddingAndLoss),
];

impl PipelineSplit {
    /// The name `pipeline_split` takes for this rule.
    pub fn name(self) -> &'static str {
        SPLITS
            .iter()
            .find(|(_, split)| *split == self)
            .map_or("even", |(name, _)| name)
    }

    /// The code of the `pipeline_split` layout field.
    pub fn code(self) -> f64 {
        SPLITS
            .iter()
            .position(|(_, split)| *split == self)
            .map_or(0.0, |index| index as f64)
    }
}
