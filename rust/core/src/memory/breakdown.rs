//! What an estimate returns: the bytes of one configuration's busiest stage, by part.

/// Names of the output columns, in [`Breakdown::to_values`] order.
pub const OUTPUT_FIELDS: [&str; 18] = [
    "params",
    "grads",
    "optimizer",
    "activations",
    "overhead",
    "total",
    "act_attention",
    "act_mlp",
    "act_norm",
    "act_embedding",
    "act_logits",
    "act_checkpoints",
    "act_working",
    "act_comm",
    "act_mtp",
    "stage",
    "layers",
    "cpu_optimizer",
];

/// Number of output columns.
pub const N_OUTPUT_FIELDS: usize = OUTPUT_FIELDS.len();

/// Per-GPU bytes of the busiest pipeline stage.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Breakdown {
    pub params: f64,
    pub grads: f64,
    pub optimizer: f64,
    pub activations: f64,
    pub overhead: f64,
    pub total: f64,
    /// Attention blocks of the layers in flight.
    pub act_attention: f64,
    /// MLP / MoE blocks of the layers in flight.
    pub act_mlp: f64,
    /// Norm inputs and statistics (the residual stream) of the layers in flight.
    pub act_norm: f64,
    /// Token ids (modern) or the embedding dropout mask (korthikanti) on the first stage.
    pub act_embedding: f64,
    /// Final norm, output projection input and logits on the last stage.
    pub act_logits: f64,
    /// Layer inputs kept by full recomputation.
    pub act_checkpoints: f64,
    /// One layer's activations rebuilt during backward under full recomputation.
    pub act_working: f64,
    /// Communication buffers of one layer at a time: expert-parallel all-to-all, context-
    /// parallel key/value exchange.
    pub act_comm: f64,
    /// Multi-token-prediction modules on the last stage: their inputs, layer, head and loss.
    pub act_mtp: f64,
    /// Index of the pipeline stage reported.
    pub stage: f64,
    /// Transformer layers held by that stage (multi-token-prediction layers not included).
    pub layers: f64,
    /// Optimizer state offloaded to CPU memory (not in `total`).
    pub cpu_optimizer: f64,
}

impl Breakdown {
    /// Values in [`OUTPUT_FIELDS`] order.
    pub fn to_values(&self) -> [f64; N_OUTPUT_FIELDS] {
        [
            self.params,
            self.grads,
            self.optimizer,
            self.activations,
            self.overhead,
            self.total,
            self.act_attention,
            self.act_mlp,
            self.act_norm,
            self.act_embedding,
            self.act_logits,
            self.act_checkpoints,
            self.act_working,
            self.act_comm,
            self.act_mtp,
            self.stage,
            self.layers,
            self.cpu_optimizer,
        ]
    }
}
