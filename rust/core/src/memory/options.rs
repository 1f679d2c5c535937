//! The named options of an estimate (`recompute="full"`, `param_dtype="bf16"`...): each is
//! an enum that parses its own names and gives the number its layout field holds.
//!
//! Names match in any case, lowercased as Python's `str.lower` does (Rust's
//! `str::to_lowercase` follows the same Unicode tables: the Kelvin sign is a `k`).

use std::str::FromStr;

use rayon::prelude::*;

use crate::error::{Error, Result};
use crate::memory::activations::CpComm;
use crate::memory::layout::{ActivationModel, Modules, Recompute};
use crate::memory::pipeline::PipelineSplit;

/// An option whose values are names: the names it accepts and the number each stands for
/// in its layout field (a code, or bytes for a dtype).
pub trait Choice: Copy + PartialEq + Sized + 'static {
    /// The option, as the error names it.
    const OPTION: &'static str;
    /// The names, with their choice and its value (several names may share one).
    const CHOICES: &'static [(&'static str, Self, f64)];

    /// The value the layout field holds.
    fn code(self) -> f64 {
        let found = Self::CHOICES.iter().find(|(_, choice, _)| *choice == self);
        found.map_or(f64::NAN, |&(_, _, code)| code)
    }

    /// The choice `name` names, in any case; the error lists the choices.
    fn parse(name: &str) -> Result<Self> {
        Self::parse_as(Self::OPTION, name)
    }

    /// [`Choice::parse`], naming option `option` in the error (options that share choices).
    fn parse_as(option: &str, name: &str) -> Result<Self> {
        let lower = name.to_lowercase();
        let found = Self::CHOICES.iter().find(|(choice, ..)| *choice == lower);
        found.map(|&(_, choice, _)| choice).ok_or_else(|| {
            let listed: Vec<String> = Self::CHOICES
                .iter()
                .map(|(n, ..)| format!("'{n}'"))
                .collect();
            Error::invalid(format!(
                "{option} must be one of {}, got '{name}'",
                listed.join(", ")
            ))
        })
    }
}

/// Implements [`Choice`] and [`FromStr`] for an enum: its option's name, then each name
/// with the variant it stands for and the value its layout field holds.
macro_rules! choice {
    ($type:ident, $option:literal: $($name:literal => $variant:ident = $code:literal,)*) => {
        impl Choice for $type {
            const OPTION: &'static str = $option;
            const CHOICES: &'static [(&'static str, Self, f64)] = &[$(($name, $type::$variant, $code)),*];
        }

        impl FromStr for $type {
            type Err = Error;

            fn from_str(name: &str) -> Result<Self> {
                <$type as Choice>::parse(name)
            }
        }
    };
}

/// How attention keeps what its backward needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Attention {
    /// Flash attention: no `s x s` scores kept.
    Flash,
    /// Eager attention: the softmax probabilities kept.
    Eager,
}

/// What the loss keeps of the logits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Loss {
    /// The logits are kept for the loss's backward.
    Standard,
    /// A fused (chunked) cross-entropy keeps no logits.
    Fused,
}

/// A floating-point format (its value: bytes per element).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dtype {
    Fp32,
    Bf16,
    Fp16,
    Fp8,
}

/// An optimizer (its value: the states it keeps per parameter).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Optimizer {
    /// AdamW (or Adam): two moments.
    Adam,
    /// Lion, Muon, SGD with momentum: one.
    Momentum,
    /// SGD without momentum: none.
    Stateless,
}

choice!(Attention, "attention": "flash" => Flash = 0.0, "eager" => Eager = 1.0,);
choice!(Loss, "loss": "standard" => Standard = 0.0, "fused" => Fused = 1.0,);
choice!(CpComm, "cp_comm": "p2p" => P2p = 0.0, "all_gather" => AllGather = 1.0, "a2a" => A2a = 2.0,);
choice!(ActivationModel, "activation_model":
    "modern" => Modern = 0.0,
    "korthikanti" => Korthikanti = 1.0,
);
choice!(PipelineSplit, "pipeline_split":
    "even" => Even = 0.0,
    "auto" => Auto = 1.0,
    "embedding" => Embedding = 2.0,
    "loss" => Loss = 3.0,
    "embedding_and_loss" => EmbeddingAndLoss = 4.0,
);
choice!(Dtype, "dtype":
    "fp32" => Fp32 = 4.0,
    "float32" => Fp32 = 4.0,
    "tf32" => Fp32 = 4.0,
    "bf16" => Bf16 = 2.0,
    "bfloat16" => Bf16 = 2.0,
    "fp16" => Fp16 = 2.0,
    "float16" => Fp16 = 2.0,
    "fp8" => Fp8 = 1.0,
);
choice!(Optimizer, "optimizer":
    "adamw" => Adam = 2.0,
    "adam" => Adam = 2.0,
    "lion" => Momentum = 1.0,
    "muon" => Momentum = 1.0,
    "sgd" => Momentum = 1.0,
    "sgd_no_momentum" => Stateless = 0.0,
);

/// The plain `recompute` modes and their codes.
pub const RECOMPUTE_MODES: [(&str, u8); 3] = [("none", 0), ("selective", 1), ("full", 2)];

/// Megatron-Core's `recompute_modules` the estimate models, each with its bit.
pub const RECOMPUTE_MODULES: [(&str, u8); 7] = [
    ("core_attn", Modules::CORE_ATTN),
    ("mlp", Modules::MLP),
    ("layernorm", Modules::LAYERNORM),
    ("moe", Modules::MOE),
    ("shared_experts", Modules::SHARED_EXPERTS),
    ("mla_up_proj", Modules::MLA_UP_PROJ),
    ("moe_act", Modules::MOE_ACT),
];

/// Joins modules in a `recompute` name.
const SEPARATOR: char = '+';

impl FromStr for Recompute {
    type Err = Error;

    /// A mode, or modules joined with `+` in any order (a module named twice counts once).
    fn from_str(name: &str) -> Result<Self> {
        let lower = name.to_lowercase();
        let code = match RECOMPUTE_MODES.iter().find(|(mode, _)| *mode == lower) {
            Some(&(_, code)) => Some(code),
            None => lower
                .split(SEPARATOR)
                .try_fold(0u8, |bits, part| {
                    let (_, bit) = RECOMPUTE_MODULES
                        .iter()
                        .find(|(module, _)| *module == part)?;
                    Some(bits | bit)
                })
                .map(|bits| 2 + bits),
        };
        code.map(|code| Recompute::from_code(f64::from(code)))
            .ok_or_else(|| {
                let modes: Vec<String> = RECOMPUTE_MODES
                    .iter()
                    .map(|(n, _)| format!("'{n}'"))
                    .collect();
                let modules: Vec<String> = RECOMPUTE_MODULES
                    .iter()
                    .map(|(n, _)| format!("'{n}'"))
                    .collect();
                Error::invalid(format!(
                    "recompute must be one of {} or Megatron-Core modules ({}) joined with \
                 '{SEPARATOR}', got '{name}'",
                    modes.join(", "),
                    modules.join(", ")
                ))
            })
    }
}

impl Recompute {
    /// The `recompute` code of the mode: a set of modules is 2 plus its bits, so that
    /// `core_attn` alone, Megatron-Core's default, is 3.
    pub fn code(self) -> f64 {
        match self {
            Recompute::None => 0.0,
            Recompute::Selective => 1.0,
            Recompute::Full => 2.0,
            Recompute::Modules(modules) => 2.0 + f64::from(modules.bits()),
        }
    }

    /// The name of the mode: the modules in [`RECOMPUTE_MODULES`] order joined with `+`.
    pub fn name(self) -> String {
        match self {
            Recompute::Modules(modules) => {
                let names: Vec<&str> = RECOMPUTE_MODULES
                    .iter()
                    .filter(|(_, bit)| modules.has(*bit))
                    .map(|(name, _)| *name)
                    .collect();
                names.join("+")
            }
            mode => RECOMPUTE_MODES[mode.code() as usize].0.to_string(),
        }
    }
}

/// The number that layout field `option` holds for `name` (case-insensitive): the code of
/// a named choice, or the bytes of a dtype. An error names the option and lists its
/// choices.
pub fn option_code(option: &str, name: &str) -> Result<f64> {
    Ok(match option {
        "recompute" => name.parse::<Recompute>()?.code(),
        "attention" => Attention::parse(name)?.code(),
        "loss" => Loss::parse(name)?.code(),
        "cp_comm" => CpComm::parse(name)?.code(),
        "activation_model" => ActivationModel::parse(name)?.code(),
        "pipeline_split" => PipelineSplit::parse(name)?.code(),
        "optimizer" => Optimizer::parse(name)?.code(),
        _ if option.ends_with("_dtype") => Dtype::parse_as(option, name)?.code(),
        _ => return Err(Error::invalid(format!("{option} takes no names"))),
    })
}

/// The names option `option` accepts with their values, in the order listed (for
/// `recompute`, its modes; its modules are [`RECOMPUTE_MODULES`]).
pub fn option_choices(option: &str) -> Result<Vec<(&'static str, f64)>> {
    fn all<T: Choice>() -> Vec<(&'static str, f64)> {
        T::CHOICES
            .iter()
            .map(|&(name, _, code)| (name, code))
            .collect()
    }
    Ok(match option {
        "recompute" => RECOMPUTE_MODES
            .iter()
            .map(|&(name, code)| (name, f64::from(code)))
            .collect(),
        "attention" => all::<Attention>(),
        "loss" => all::<Loss>(),
        "cp_comm" => all::<CpComm>(),
        "activation_model" => all::<ActivationModel>(),
        "pipeline_split" => all::<PipelineSplit>(),
        "optimizer" => all::<Optimizer>(),
        _ if option.ends_with("_dtype") => all::<Dtype>(),
        _ => return Err(Error::invalid(format!("{option} takes no names"))),
    })
}

/// Strings parsed per parallel task.
const CHUNK: usize = 4096;

/// Distinct strings a task remembers the value of: a column holds a handful of names.
const REMEMBERED: usize = 16;

/// [`option_code`] of every string of a column of fixed-width strings as numpy stores
/// them (`rows`: `width` UTF-32 code points per string, padded with zeros), NaN for a
/// string that names nothing (an invalid cell of a grid). Each distinct string is parsed
/// once per task.
pub fn option_codes(option: &str, rows: &[u32], width: usize) -> Result<Vec<f64>> {
    option_choices(option)?;
    if width == 0 {
        return Err(Error::invalid("strings of width 0"));
    }
    let parse = |row: &[u32]| {
        let end = row.iter().rposition(|&c| c != 0).map_or(0, |last| last + 1);
        let name: Option<String> = row[..end].iter().map(|&c| char::from_u32(c)).collect();
        name.and_then(|name| option_code(option, &name).ok())
            .unwrap_or(f64::NAN)
    };
    let mut codes = vec![f64::NAN; rows.len() / width];
    codes
        .par_chunks_mut(CHUNK)
        .zip(rows.par_chunks(width * CHUNK))
        .for_each(|(codes, rows)| {
            let mut seen: Vec<(&[u32], f64)> = Vec::with_capacity(REMEMBERED);
            for (code, row) in codes.iter_mut().zip(rows.chunks_exact(width)) {
                // Compared code point by code point: the rows are short, and a `memcmp`
                // call per comparison cost more than the comparison.
                let known = seen
                    .iter()
                    .find(|(known, _)| known.iter().zip(row).all(|(a, b)| a == b));
                *code = match known {
                    Some(&(_, known)) => known,
                    None => {
                        let parsed = parse(row);
                        if seen.len() < REMEMBERED {
                            seen.push((row, parsed));
                        }
                        parsed
                    }
                };
            }
        });
    Ok(codes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_parse_in_any_case_and_errors_list_the_choices() {
        assert_eq!(option_code("attention", "EAGER"), Ok(1.0));
        assert_eq!(
            option_code("activation_model", "\u{212a}orthikanti"),
            Ok(1.0)
        );
        assert!(option_code("activation_model", "korthikant\u{130}").is_err());
        assert_eq!(option_code("param_dtype", "BFloat16"), Ok(2.0));
        assert_eq!(option_code("optimizer", "sgd_no_momentum"), Ok(0.0));
        let error = option_code("attention", "x").unwrap_err().to_string();
        assert_eq!(error, "attention must be one of 'flash', 'eager', got 'x'");
        assert!(option_code("cp_comm", "ring")
            .unwrap_err()
            .to_string()
            .contains("'a2a'"));
        assert!(option_code("seq_len", "long").is_err());
    }

    #[test]
    fn a_column_of_strings_gives_each_string_its_code() {
        let rows: Vec<u32> = ["FULL", "none", "bogus", "core_attn+mlp"]
            .iter()
            .flat_map(|name| {
                let mut row: Vec<u32> = name.chars().map(u32::from).collect();
                row.resize(13, 0);
                row
            })
            .collect();
        let codes = option_codes("recompute", &rows, 13).unwrap();
        assert_eq!(codes[..2], [2.0, 0.0]);
        assert!(codes[2].is_nan());
        assert_eq!(codes[3], 5.0);
        assert!(option_codes("dp", &rows, 13).is_err());
    }

    #[test]
    fn recompute_sets_of_modules_parse_in_any_order_and_name_themselves() {
        let code = |name: &str| name.parse::<Recompute>().map(Recompute::code);
        assert_eq!(code("full"), Ok(2.0));
        assert_eq!(code("core_attn"), Ok(3.0));
        assert_eq!(code("MLP+Core_Attn"), code("core_attn+mlp+mlp"));
        assert_eq!(code("core_attn+mlp"), Ok(5.0));
        for bad in [
            "mlp+",
            "+mlp",
            "mlp++moe",
            "mlp+full",
            "moe_acts",
            "mlp + moe",
            "",
        ] {
            let error = code(bad).unwrap_err().to_string();
            assert!(error.contains("Megatron-Core modules"), "{bad}: {error}");
        }
        for code in 0..=(2 + Modules::ALL) {
            let mode = Recompute::from_code(f64::from(code));
            assert_eq!(mode.name().parse::<Recompute>(), Ok(mode), "{code}");
            assert_eq!(mode.code(), f64::from(code));
        }
    }
}
