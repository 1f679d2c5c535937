//! What an estimate computes from the fields that do not vary along a pipeline or a batch
//! ([`TermsKey`]): activations per token of each kind of layer, parameters per rank.

use crate::memory::activations::{ActCtx, Activations, CpComm, LayerActs};
use crate::memory::checks::{ep_fit, tp_fit};
use crate::memory::layout::{ActivationModel, Invalid, Layout, Recompute};
use crate::memory::numeric::ceil;
use crate::memory::prepared::Prepared;
use crate::memory::spec::Implementation;

/// Tokens of a `seq_len`-token sequence on each of `cp` context-parallel ranks: with load
/// balancing, a sequence is padded to a multiple of `2 * cp` and cut into `2 * cp` chunks,
/// two per rank (Transformer Engine's and Megatron's convention).
#[inline(always)]
pub(crate) fn cp_rank_tokens(seq_len: f64, cp: f64) -> f64 {
    if cp == 1.0 {
        seq_len
    } else {
        ceil(seq_len / (2.0 * cp)) * 2.0
    }
}

/// Routed copies per token relative to `top_k`: the capacity factor when experts' inputs
/// are padded to capacity, 1 for dropless routing with a balanced load.
fn capacity_multiple(capacity_factor: f64) -> f64 {
    if capacity_factor > 0.0 {
        capacity_factor
    } else {
        1.0
    }
}

/// Words of a [`TermsKey`].
pub(crate) const TERMS_KEY_WORDS: usize = 16;

/// The fields of a configuration that its [`Terms`] depend on: all but the batch shape,
/// the data-parallel and pipeline layout, ZeRO and the bytes of the model states.
#[derive(Debug, Clone, Copy)]
pub(crate) struct TermsKey {
    tp: f64,
    sequence_parallel: f64,
    recompute: f64,
    activation_bytes: f64,
    attention: f64,
    fused_swiglu: f64,
    fp8: f64,
    activation_model: f64,
    moe_capacity_factor: f64,
    param_bytes: f64,
    ep: f64,
    cp: f64,
    cp_comm: f64,
    loss: f64,
    logits_bytes: f64,
    /// Keys each query attends to, where a layer's activations depend on them (eager
    /// attention keeps its probabilities, `korthikanti` its scores); NaN elsewhere, so that
    /// cells of every sequence length share the key.
    key_len: f64,
}

impl TermsKey {
    #[inline(always)]
    pub fn new(l: &Layout) -> Self {
        let key_len = if l.attention == 1.0 || l.activation_model == 1.0 {
            cp_rank_tokens(l.seq_len, l.cp)
        } else {
            f64::NAN
        };
        TermsKey {
            tp: l.tp,
            sequence_parallel: l.sequence_parallel,
            recompute: l.recompute,
            activation_bytes: l.activation_bytes,
            attention: l.attention,
            fused_swiglu: l.fused_swiglu,
            fp8: l.fp8,
            activation_model: l.activation_model,
            moe_capacity_factor: l.moe_capacity_factor,
            param_bytes: l.param_bytes,
            ep: l.ep,
            cp: l.cp,
            cp_comm: l.cp_comm,
            loss: l.loss,
            logits_bytes: l.logits_bytes,
            key_len,
        }
    }

    /// The fields' bits: equal bits, equal terms.
    #[inline(always)]
    pub fn words(&self) -> [u64; TERMS_KEY_WORDS] {
        [
            self.tp,
            self.sequence_parallel,
            self.recompute,
            self.activation_bytes,
            self.attention,
            self.fused_swiglu,
            self.fp8,
            self.activation_model,
            self.moe_capacity_factor,
            self.param_bytes,
            self.ep,
            self.cp,
            self.cp_comm,
            self.loss,
            self.logits_bytes,
            self.key_len,
        ]
        .map(f64::to_bits)
    }
}

/// What a configuration's estimate needs per token of a micro-batch and per rank: the
/// activations of a layer, of the head and loss, of multi-token prediction and of the
/// communication buffers per token, and the parameters a rank holds of each kind of
/// layer. A function of [`TermsKey`] alone.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Terms {
    /// How `tp` fits the heads and MLP widths, and `ep` the experts.
    pub(crate) tp_fit: Result<(), Invalid>,
    pub(crate) ep_fit: Result<(), Invalid>,
    pub(crate) korthikanti: bool,
    pub(crate) dense_acts: LayerActs,
    pub(crate) moe_acts: LayerActs,
    /// Bytes per micro-batch of an MoE layer that do not scale with tokens.
    pub(crate) moe_fixed: f64,
    pub(crate) checkpoint: f64,
    /// Full recomputation's working layer, dense and MoE: bytes per token and per
    /// micro-batch of a layer with nothing recomputed away (unused unless recompute is
    /// full).
    pub(crate) working_dense: (f64, f64),
    pub(crate) working_moe: (f64, f64),
    pub(crate) embedding_per_token: f64,
    /// The rotary tables' width and element bytes, when they are kept.
    pub(crate) rotary: Option<(f64, f64)>,
    /// Final norm, output projection input and loss per token.
    pub(crate) head_per_token: f64,
    /// One multi-token-prediction module per token and per micro-batch.
    pub(crate) mtp: (f64, f64),
    /// Communication buffers of one layer per token (EP all-to-all, CP key/value exchange).
    pub(crate) comm_per_token: f64,
    /// Per-layer (dense, expert) parameters per rank of dense and of MoE layers, and of a
    /// multi-token-prediction module (its layer, norms and projection).
    pub(crate) dense_layer: (f64, f64),
    pub(crate) moe_layer: (f64, f64),
    pub(crate) mtp_module: (f64, f64),
    /// The embedding's (and an untied output layer's) parameters per rank.
    pub(crate) embedding_per_rank: f64,
}

impl Terms {
    pub(crate) fn new(prep: &Prepared, k: &TermsKey) -> Self {
        let spec = &prep.spec;
        let t = k.tp;
        let sp = k.sequence_parallel == 1.0 && t > 1.0;
        let recompute = Recompute::from_code(k.recompute);
        let e = k.activation_bytes;
        let copies = spec.top_k as f64 * capacity_multiple(k.moe_capacity_factor);
        let c = ActCtx {
            e,
            t,
            rep: if sp { t } else { 1.0 },
            kv_per_rank: (spec.num_kv_heads as f64 / t).max(1.0),
            key_len: k.key_len,
            eager: k.attention == 1.0,
            fused_swiglu: k.fused_swiglu == 1.0,
            recompute,
            param_bytes: k.param_bytes,
            lin: if k.fp8 == 1.0 { 1.0 } else { e },
            copies,
        };
        let h = spec.hidden_size as f64;
        let korthikanti =
            ActivationModel::from_code(k.activation_model) == ActivationModel::Korthikanti;
        let acts = Activations::new(spec, c);

        // Per-layer activations per token (and per micro-batch for what does not scale with
        // tokens) of dense and MoE layers, and a layer's full set (the working set of full
        // recomputation, which rebuilds one layer with nothing recomputed away).
        let kept = |moe: bool| {
            if korthikanti {
                (acts.korthikanti_layer(), 0.0)
            } else {
                acts.layer(moe)
            }
        };
        let (dense_acts, _) = kept(false);
        let (moe_acts, moe_fixed) = if spec.is_moe() {
            kept(true)
        } else {
            (dense_acts, 0.0)
        };
        let checkpoint = if korthikanti { 2.0 * h } else { e * h } / c.rep;
        let (mut working_dense, mut working_moe) = ((0.0, 0.0), (0.0, 0.0));
        if recompute == Recompute::Full && !korthikanti {
            let full = Activations::new(
                spec,
                ActCtx {
                    recompute: Recompute::None,
                    ..c
                },
            );
            let layer = |moe: bool| {
                let (per_token, fixed) = full.layer(moe);
                (per_token.total(), fixed)
            };
            if !spec.is_moe() || spec.first_dense_layers > 0 {
                working_dense = layer(false);
            }
            if spec.is_moe() {
                working_moe = layer(true);
            }
        }
        // Megatron's vocabulary-parallel modules keep a bool mask per token: the embedding
        // of the ids outside its rank's part of the vocabulary (`tp > 1`), the loss of the
        // labels outside it (measured in tests/runs/megatron_cpu.py).
        let megatron = spec.implementation == Implementation::Fused;
        let embedding_per_token = if korthikanti {
            h / c.rep
        } else if megatron && t > 1.0 {
            9.0
        } else {
            8.0
        };
        // Kept unless full recomputation rebuilds them ([`Config::new`] leaves them out then).
        let rotary = if korthikanti {
            None
        } else {
            acts.rotary_table_widths()
        };
        // The loss keeps the logits (`logits_bytes`, vocabulary-parallel), the labels and
        // (Megatron) the labels' mask; a fused cross-entropy keeps only an fp32 log-sum-exp
        // per token and the labels.
        let loss_per_token = if k.loss == 1.0 {
            4.0
        } else {
            k.logits_bytes * spec.vocab_size as f64 / t + f64::from(u8::from(megatron))
        } + 8.0;
        // A multi-token-prediction module: two norms, the projection's input (2h), a layer
        // like the last, and its own head and loss.
        let mtp_moe = spec.is_moe() && spec.num_layers > spec.first_dense_layers;
        let mtp = if korthikanti || spec.mtp_layers == 0 {
            (0.0, 0.0)
        } else {
            let (layer, fixed) = if recompute == Recompute::Full {
                (checkpoint, 0.0)
            } else {
                let (layer, fixed) = kept(mtp_moe);
                (layer.total(), fixed)
            };
            (
                acts.mtp_inputs() + layer + acts.head() + loss_per_token,
                fixed,
            )
        };
        let comm_per_token = if korthikanti {
            0.0
        } else {
            acts.comm_buffers(k.ep, k.cp, CpComm::from_code(k.cp_comm))
        };
        let kv_fraction = c.kv_per_rank / spec.num_kv_heads as f64;
        let (mtp_dense, mtp_experts) = prep.mtp_layer.per_rank(t, k.ep, kv_fraction);
        Terms {
            tp_fit: tp_fit(spec, t),
            ep_fit: ep_fit(spec, k.ep),
            korthikanti,
            dense_acts,
            moe_acts,
            moe_fixed,
            checkpoint,
            working_dense,
            working_moe,
            embedding_per_token,
            rotary,
            head_per_token: acts.head() + loss_per_token,
            mtp,
            comm_per_token,
            dense_layer: prep.dense_layer.per_rank(t, k.ep, kv_fraction),
            moe_layer: prep.moe_layer.per_rank(t, k.ep, kv_fraction),
            mtp_module: (
                mtp_dense + prep.mtp_norms + prep.mtp_projection / t,
                mtp_experts,
            ),
            embedding_per_rank: prep.embedding / t,
        }
    }
}
