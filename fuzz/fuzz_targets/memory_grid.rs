//! The memory grid over arbitrary specs, shapes, values and strides: an error exactly when
//! the spec or the buffers are bad (never a read past a buffer), and otherwise every cell
//! equal, bit for bit, to estimating that cell's layout alone, with its invalid reason
//! code where it has one and non-negative bytes where it has none.
#![no_main]

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use tokenbatch_core::memory::{
    estimate_grid, estimate_one, FfnType, GridInput, Implementation, Layout, ModelSpec,
    MoeDispatcher, NormType, Values, N_LAYOUT_FIELDS, N_OUTPUT_FIELDS,
};
use tokenbatch_fuzz::Count;

#[derive(Debug, Arbitrary)]
struct Spec {
    sizes: [Count; 21],
    gelu: bool,
    layernorm: bool,
    hf: bool,
    all_gather: bool,
    flags: [bool; 4],
}

impl Spec {
    fn build(&self) -> ModelSpec {
        let s = self.sizes.map(Count::get);
        ModelSpec {
            hidden_size: s[0],
            num_layers: s[1],
            num_heads: s[2],
            num_kv_heads: s[3],
            head_dim: s[4],
            ffn_size: s[5],
            ffn_type: if self.gelu {
                FfnType::Gelu
            } else {
                FfnType::SwiGlu
            },
            vocab_size: s[6],
            tied_embeddings: self.flags[0],
            norm: if self.layernorm {
                NormType::LayerNorm
            } else {
                NormType::RmsNorm
            },
            qkv_bias: self.flags[1],
            linear_bias: self.flags[2],
            learned_positions: s[7],
            num_experts: s[8],
            top_k: s[9],
            num_shared_experts: s[10],
            moe_ffn_size: s[11],
            first_dense_layers: s[12],
            router_bias: self.flags[3],
            q_lora_rank: s[13],
            kv_lora_rank: s[14],
            qk_nope_head_dim: s[15],
            qk_rope_head_dim: s[16],
            v_head_dim: s[17],
            router_groups: s[18],
            router_group_top_k: s[19],
            mtp_layers: s[20],
            implementation: if self.hf {
                Implementation::Hf
            } else {
                Implementation::Fused
            },
            moe_dispatcher: if self.all_gather {
                MoeDispatcher::AllGather
            } else {
                MoeDispatcher::AllToAll
            },
        }
    }
}

/// A layout value: the field's default, a small whole number, or any float at all.
#[derive(Debug, Clone, Copy, Arbitrary)]
enum Value {
    Default,
    Small(u8),
    Any(f64),
}

#[derive(Debug, Clone, Copy, Arbitrary)]
enum Stride {
    Zero,
    Small(u8),
    Any(usize),
}

#[derive(Debug, Arbitrary)]
struct Field {
    values: Vec<Value>,
    strides: Vec<Stride>,
    /// One stride too many for the grid's rank.
    wrong_rank: bool,
    /// Pass the values as int64 (saturated), as numpy integer inputs arrive.
    integers: bool,
    /// With `integers`, as int32 (saturated) instead.
    narrow: bool,
}

#[derive(Debug, Arbitrary)]
struct Case {
    spec: Spec,
    /// Up to four axes of up to four cells.
    shape: Vec<u8>,
    fields: Vec<Field>,
    /// Pass one input too few.
    missing_input: bool,
}

/// One input's values as float64 (and as int64 or int32 when passed so) and its strides.
type Buffers = (Vec<f64>, Option<Integers>, Vec<usize>);

/// Values passed as integers.
enum Integers {
    I64(Vec<i64>),
    I32(Vec<i32>),
}

fuzz_target!(|case: Case| {
    let spec = case.spec.build();
    let shape: Vec<usize> = case
        .shape
        .iter()
        .take(4)
        .map(|&n| usize::from(n % 5))
        .collect();
    let defaults = Layout::default().to_values();
    let fields: Vec<Buffers> = (0..N_LAYOUT_FIELDS)
        .map(|f| {
            let Some(field) = case.fields.get(f) else {
                return (vec![defaults[f]], None, vec![0; shape.len()]);
            };
            let values: Vec<f64> = field
                .values
                .iter()
                .map(|v| match *v {
                    Value::Default => defaults[f],
                    Value::Small(n) => f64::from(n),
                    Value::Any(x) => x,
                })
                .collect();
            let integers = match (field.integers, field.narrow) {
                (false, _) => None,
                (true, false) => Some(Integers::I64(values.iter().map(|&x| x as i64).collect())),
                (true, true) => Some(Integers::I32(values.iter().map(|&x| x as i32).collect())),
            };
            let rank = shape.len() + usize::from(field.wrong_rank);
            let strides = (0..rank)
                .map(
                    |d| match field.strides.get(d).copied().unwrap_or(Stride::Zero) {
                        Stride::Zero => 0,
                        Stride::Small(s) => usize::from(s % 8),
                        Stride::Any(s) => s,
                    },
                )
                .collect();
            (values, integers, strides)
        })
        .collect();
    let count = N_LAYOUT_FIELDS - usize::from(case.missing_input);
    let inputs: Vec<GridInput<'_>> = fields[..count]
        .iter()
        .map(|(floats, integers, strides)| GridInput {
            data: match integers {
                None => Values::F64(floats),
                Some(Integers::I64(values)) => Values::I64(values),
                Some(Integers::I32(values)) => Values::I32(values),
            },
            strides,
        })
        .collect();

    let cells: usize = shape.iter().product();
    let offset = |strides: &[usize], index: &[usize]| -> Option<usize> {
        index
            .iter()
            .zip(strides)
            .try_fold(0usize, |acc, (&i, &s)| acc.checked_add(i.checked_mul(s)?))
    };
    let last: Vec<usize> = shape.iter().map(|&n| n.saturating_sub(1)).collect();
    let buffers_fit = inputs.iter().all(|input| {
        input.strides.len() == shape.len()
            && (cells == 0 || offset(input.strides, &last).is_some_and(|o| o < input.data.len()))
    });
    let spec_ok = spec.validate().is_ok();
    let result = estimate_grid(&spec, &shape, &inputs);
    let table = match result {
        Ok(table) => table,
        Err(error) => {
            assert!(
                !(spec_ok && buffers_fit && count == N_LAYOUT_FIELDS),
                "refused a valid grid: {error}"
            );
            return;
        }
    };
    assert!(
        spec_ok && buffers_fit && count == N_LAYOUT_FIELDS,
        "accepted a bad spec or buffers"
    );
    assert_eq!(table.cells(), cells);
    assert_eq!(table.values.len(), cells * N_OUTPUT_FIELDS);
    let mut index = vec![0usize; shape.len()];
    for cell in 0..cells {
        let mut rest = cell;
        for d in (0..shape.len()).rev() {
            index[d] = rest % shape[d];
            rest /= shape[d];
        }
        let mut values = [0.0; N_LAYOUT_FIELDS];
        for (value, input) in values.iter_mut().zip(&inputs) {
            *value = input
                .data
                .get(offset(input.strides, &index).unwrap_or(usize::MAX));
        }
        let got: Vec<f64> = (0..N_OUTPUT_FIELDS).map(|k| table.field(k)[cell]).collect();
        match estimate_one(&spec, &Layout::from_values(&values)) {
            Ok(Ok(breakdown)) => {
                assert_eq!(table.reasons[cell], 0, "cell {cell}: {values:?}");
                let expected = breakdown.to_values();
                for (k, (g, e)) in got.iter().zip(expected).enumerate() {
                    assert_eq!(
                        g.to_bits(),
                        e.to_bits(),
                        "cell {cell} field {k}: grid {g}, alone {e}"
                    );
                    assert!(
                        g.is_finite() && *g >= 0.0,
                        "cell {cell} field {k} is {g} for {values:?}"
                    );
                }
            }
            Ok(Err(invalid)) => {
                assert_eq!(
                    table.reasons[cell],
                    invalid.code(),
                    "cell {cell}: {values:?}"
                );
                assert!(got.iter().all(|g| g.is_nan()));
            }
            Err(error) => panic!("the single estimate refused a spec the grid took: {error}"),
        }
    }
});
