//! Cells that bring their own channels (`data.screen.cell_channels: own`): which of them a
//! channel combination can be read from, and where its channels lie in each. A `bag` or
//! `tokens` model trains on every cell with its own channels; an analysis of one combination
//! (features, kNN, evaluation, attention maps) embeds the combination's channels, so it runs
//! on the cells that hold all of them, as CHAMMI scores each dataset on its own channels.
use super::split::Split;
use super::ImageSource;

/// Where the combination's channels (`channels`: positions in `data.channel_names`) lie
/// among cell `i`'s, in the combination's order: the channel selection that reads the
/// combination from the cell as [`ImageSource::read`] returns it. `Ok(None)` for sources
/// whose cells hold every channel (select `channels` themselves); `Err` with the channels
/// the cell holds when it lacks one.
pub fn selection_in_cell(
    source: &dyn ImageSource,
    i: usize,
    channels: &[usize],
) -> Result<Option<Vec<usize>>, Vec<usize>> {
    let Some(own) = source.cell_channels(i) else {
        return Ok(None);
    };
    channels
        .iter()
        .map(|c| own.iter().position(|o| o == c))
        .collect::<Option<Vec<usize>>>()
        .map(Some)
        .ok_or_else(|| own.to_vec())
}

/// Whether cell `i` holds every channel of `channels`.
pub fn holds_all(source: &dyn ImageSource, i: usize, channels: &[usize]) -> bool {
    selection_in_cell(source, i, channels).is_ok()
}

/// `indices` without the cells that lack a channel of `channels` (all of them for a source
/// whose cells hold every channel), in order.
pub fn holding(source: &dyn ImageSource, indices: &[usize], channels: &[usize]) -> Vec<usize> {
    indices
        .iter()
        .copied()
        .filter(|&i| holds_all(source, i, channels))
        .collect()
}

/// `split` kept to the cells that hold every channel of `channels`, and how many it left
/// out (logged by the caller, which knows the combination).
pub fn split_holding(source: &dyn ImageSource, split: Split, channels: &[usize]) -> (Split, usize) {
    let before = split.train.len() + split.held_out.len();
    let kept = Split {
        train: holding(source, &split.train, channels),
        held_out: holding(source, &split.held_out, channels),
    };
    let left_out = before - kept.train.len() - kept.held_out.len();
    (kept, left_out)
}

/// The configured split of `source` (see [`super::configured_split`]) for the analyses of the
/// combination `channels`: kept to the cells holding all of them, saying how many were left
/// out.
pub fn combination_split(
    source: &dyn ImageSource,
    data: &crate::config::DataSection,
    seed: u32,
    channels: &[usize],
) -> Result<Split, super::DataError> {
    let split = super::configured_split(source.index(), data, seed)?;
    let (split, left_out) = split_holding(source, split, channels);
    // Said once per combination: the features, attention and the other analyses each ask,
    // for every checkpoint.
    static SAID: std::sync::Mutex<std::collections::BTreeSet<Vec<usize>>> =
        std::sync::Mutex::new(std::collections::BTreeSet::new());
    let first = SAID
        .lock()
        .map(|mut said| said.insert(channels.to_vec()))
        .unwrap_or(true);
    if left_out > 0 && first {
        let names: Vec<&str> = channels
            .iter()
            .map(|&c| data.channel_names[c].as_str())
            .collect();
        tracing::info!(
            "{left_out} cells lack a channel of [{}] (data.screen.cell_channels: own): left out \
             of this combination's analyses",
            names.join(", ")
        );
    }
    Ok(split)
}
