//! A [`ModelSpec`] read and built field by field, by name: the one list of its fields that
//! bindings use, each value checked and each option name parsed here, once.

use crate::error::{at_least, Error, Result};

use super::spec::ModelSpec;

/// The fields of a spec, in the order a binding lists them.
pub const SPEC_FIELDS: [&str; 29] = [
    "hidden_size",
    "num_layers",
    "num_heads",
    "ffn_size",
    "vocab_size",
    "num_kv_heads",
    "head_dim",
    "ffn_type",
    "tied_embeddings",
    "norm",
    "qkv_bias",
    "linear_bias",
    "learned_positions",
    "num_experts",
    "top_k",
    "num_shared_experts",
    "moe_ffn_size",
    "first_dense_layers",
    "router_bias",
    "router_groups",
    "router_group_top_k",
    "q_lora_rank",
    "kv_lora_rank",
    "qk_nope_head_dim",
    "qk_rope_head_dim",
    "v_head_dim",
    "mtp_layers",
    "implementation",
    "moe_dispatcher",
];

/// Fields that must be at least 1 (the other counts may be 0).
const POSITIVE: [&str; 6] = [
    "hidden_size",
    "num_layers",
    "num_heads",
    "vocab_size",
    "num_kv_heads",
    "head_dim",
];

/// A field's value: a count, a flag or the name of an option.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Field {
    /// Signed, so that a negative count given by a user is refused by name, not by a
    /// failed conversion.
    Count(i64),
    Flag(bool),
    Name(String),
}

impl std::fmt::Display for Field {
    /// As Python writes the value.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Field::Count(count) => write!(f, "{count}"),
            Field::Flag(true) => write!(f, "True"),
            Field::Flag(false) => write!(f, "False"),
            Field::Name(name) => write!(f, "'{name}'"),
        }
    }
}

impl ModelSpec {
    /// Build a spec from named fields (each at most once; the names of [`SPEC_FIELDS`]).
    ///
    /// Missing counts are 0, flags false and options their first choice, except
    /// `num_kv_heads` (`num_heads`, multi-head attention) and `head_dim`
    /// (`hidden_size / num_heads`). The shape is then [validated](ModelSpec::validate).
    pub fn from_fields(fields: Vec<(&str, Field)>) -> Result<ModelSpec> {
        let mut spec = ModelSpec::default();
        let given: Vec<&str> = fields.iter().map(|(name, _)| *name).collect();
        let given = |name: &str| given.contains(&name);
        for (name, value) in fields {
            spec.set(name, value)?;
        }
        for required in &SPEC_FIELDS[..5] {
            if !given(required) {
                return Err(Error::invalid(format!("{required} is required")));
            }
        }
        if !given("num_kv_heads") {
            spec.num_kv_heads = spec.num_heads;
        }
        if !given("head_dim") {
            if spec.hidden_size % spec.num_heads != 0 {
                return Err(Error::invalid(format!(
                    "num_heads={} must divide hidden_size={} (or give head_dim explicitly)",
                    spec.num_heads, spec.hidden_size
                )));
            }
            spec.head_dim = spec.hidden_size / spec.num_heads;
        }
        spec.validate()?;
        Ok(spec)
    }

    /// The value of field `name`, or `None` for a name that is not a field.
    pub fn get(&self, name: &str) -> Option<Field> {
        Some(match name {
            "ffn_type" => Field::Name(self.ffn_type.name().to_string()),
            "norm" => Field::Name(self.norm.name().to_string()),
            "implementation" => Field::Name(self.implementation.name().to_string()),
            "moe_dispatcher" => Field::Name(self.moe_dispatcher.name().to_string()),
            "tied_embeddings" => Field::Flag(self.tied_embeddings),
            "qkv_bias" => Field::Flag(self.qkv_bias),
            "linear_bias" => Field::Flag(self.linear_bias),
            "router_bias" => Field::Flag(self.router_bias),
            // Counts are checked against 2^53 parameters, far below i64::MAX.
            _ => {
                let count = *self.clone().count_field_mut(name)?;
                Field::Count(i64::try_from(count).unwrap_or(i64::MAX))
            }
        })
    }

    fn set(&mut self, name: &str, value: Field) -> Result<()> {
        let kind_error = || {
            let kind = match ModelSpec::default().get(name) {
                Some(Field::Count(_)) => "an integer",
                Some(Field::Flag(_)) => "a bool",
                Some(Field::Name(_)) => "a string",
                None => {
                    return Error::invalid(format!(
                        "unknown ModelSpec field '{name}'; fields: {}",
                        SPEC_FIELDS.join(", ")
                    ))
                }
            };
            Error::invalid(format!("{name} must be {kind}, got {value}"))
        };
        match (name, &value) {
            ("ffn_type", Field::Name(text)) => self.ffn_type = text.parse()?,
            ("norm", Field::Name(text)) => self.norm = text.parse()?,
            ("implementation", Field::Name(text)) => self.implementation = text.parse()?,
            ("moe_dispatcher", Field::Name(text)) => self.moe_dispatcher = text.parse()?,
            ("tied_embeddings", Field::Flag(flag)) => self.tied_embeddings = *flag,
            ("qkv_bias", Field::Flag(flag)) => self.qkv_bias = *flag,
            ("linear_bias", Field::Flag(flag)) => self.linear_bias = *flag,
            ("router_bias", Field::Flag(flag)) => self.router_bias = *flag,
            (_, Field::Count(count)) => {
                let minimum = u64::from(POSITIVE.contains(&name));
                let checked = at_least(*count, minimum, name)?;
                *self.count_field_mut(name).ok_or_else(kind_error)? = checked;
            }
            _ => return Err(kind_error()),
        }
        Ok(())
    }

    /// The count fields by name (the other fields are flags and options).
    fn counts(&mut self) -> [(&'static str, &mut u64); 21] {
        [
            ("hidden_size", &mut self.hidden_size),
            ("num_layers", &mut self.num_layers),
            ("num_heads", &mut self.num_heads),
            ("ffn_size", &mut self.ffn_size),
            ("vocab_size", &mut self.vocab_size),
            ("num_kv_heads", &mut self.num_kv_heads),
            ("head_dim", &mut self.head_dim),
            ("learned_positions", &mut self.learned_positions),
            ("num_experts", &mut self.num_experts),
            ("top_k", &mut self.top_k),
            ("num_shared_experts", &mut self.num_shared_experts),
            ("moe_ffn_size", &mut self.moe_ffn_size),
            ("first_dense_layers", &mut self.first_dense_layers),
            ("router_groups", &mut self.router_groups),
            ("router_group_top_k", &mut self.router_group_top_k),
            ("q_lora_rank", &mut self.q_lora_rank),
            ("kv_lora_rank", &mut self.kv_lora_rank),
            ("qk_nope_head_dim", &mut self.qk_nope_head_dim),
            ("qk_rope_head_dim", &mut self.qk_rope_head_dim),
            ("v_head_dim", &mut self.v_head_dim),
            ("mtp_layers", &mut self.mtp_layers),
        ]
    }

    fn count_field_mut(&mut self, name: &str) -> Option<&mut u64> {
        self.counts()
            .into_iter()
            .find(|(field, _)| *field == name)
            .map(|(_, value)| value)
    }
}
