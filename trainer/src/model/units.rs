//! The model's own account of its structure, for the parallel strategies: which parameters
//! form one unit (the embeddings, each transformer block, the final norm, the head), the order
//! the forward pass uses them in, and which are the head's last layer. DDP lays its gradient
//! buckets out in this order and FSDP shards block by block from it, so a new architecture
//! or token layout declares itself here (each layer lists the parameters it created) and
//! needs no change in `distributed/` or the strategies.
use std::collections::HashMap;
use tch::nn;

/// What a unit is, which is all a strategy may assume about it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UnitKind {
    /// Patch (or per-channel) embedding, class token, position embedding.
    Embeddings,
    /// Transformer block `i` (0-based, in forward order): FSDP gathers and frees each on its
    /// own, around the block's hooks.
    Block(usize),
    /// The backbone's final norm.
    Norm,
    /// The projection head, last layer included.
    Head,
}

/// One unit: a module and its parameters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unit {
    pub kind: UnitKind,
    /// The module's dotted name, e.g. `backbone.blocks.3`.
    pub name: String,
    /// Its parameters' full names in forward order (weight before bias, as PyTorch registers
    /// them). Buffers (BatchNorm running statistics) are not parameters and are not listed.
    pub params: Vec<String>,
}

/// A network's units in forward order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelUnits {
    units: Vec<Unit>,
    /// The head's last layer, which `train.freeze_last_layer` holds still.
    last_layer: Vec<String>,
    /// Parameter name → (unit, position in the whole forward order).
    index: HashMap<String, (usize, usize)>,
}

/// A parameter no layer declared: DDP would never reduce its gradient and FSDP never shard
/// it, so strategies refuse to start rather than train it wrongly.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("parameter {0} is not declared by any unit of the model (model/units.rs)")]
pub struct UndeclaredParameter(pub String);

impl ModelUnits {
    /// Units in forward order; `last_layer` names parameters of those units.
    pub fn new(units: Vec<Unit>, last_layer: Vec<String>) -> Self {
        let mut index = HashMap::new();
        let mut position = 0;
        for (u, unit) in units.iter().enumerate() {
            for p in &unit.params {
                let previous = index.insert(p.clone(), (u, position));
                assert!(previous.is_none(), "{p} is declared twice");
                position += 1;
            }
        }
        for p in &last_layer {
            assert!(index.contains_key(p), "last layer {p} is not in a unit");
        }
        Self {
            units,
            last_layer,
            index,
        }
    }

    pub fn units(&self) -> &[Unit] {
        &self.units
    }

    /// Every declared parameter, in forward order.
    pub fn forward_order(&self) -> impl Iterator<Item = &str> {
        self.units
            .iter()
            .flat_map(|u| u.params.iter().map(String::as_str))
    }

    /// Sorts `names` (a subset of the declared parameters, e.g. the trainable ones) into
    /// forward order.
    pub fn sort_forward(&self, names: &mut [String]) -> Result<(), UndeclaredParameter> {
        if let Some(n) = names.iter().find(|n| !self.index.contains_key(n.as_str())) {
            return Err(UndeclaredParameter(n.clone()));
        }
        names.sort_by_key(|n| self.index[n.as_str()].1);
        Ok(())
    }

    /// The unit holding parameter `name`.
    pub fn unit_of(&self, name: &str) -> Option<&Unit> {
        self.index.get(name).map(|&(u, _)| &self.units[u])
    }

    /// The transformer blocks, in forward order.
    pub fn blocks(&self) -> impl Iterator<Item = &Unit> {
        self.units
            .iter()
            .filter(|u| matches!(u.kind, UnitKind::Block(_)))
    }

    pub fn is_last_layer(&self, name: &str) -> bool {
        self.last_layer.iter().any(|p| p == name)
    }
}

/// The dotted name of the module at `p` (`backbone.blocks.3`), as PyTorch's state dict
/// spells it.
pub(crate) fn module_name(p: &nn::Path) -> String {
    p.components().collect::<Vec<_>>().join(".")
}

/// `{module}.{leaf}` for each leaf, in the given order.
pub(crate) fn names(module: &str, leaves: &[&str]) -> Vec<String> {
    leaves.iter().map(|l| format!("{module}.{l}")).collect()
}
