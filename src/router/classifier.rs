//! PURE: a linear classifier over hashed word and character n-grams, trained at start-up from
//! the intents file's examples (multinomial logistic regression, Adagrad). No downloaded
//! model: a few hundred examples train in milliseconds, and scoring a message is one pass
//! over its features.
//!
//! Character n-grams carry spelling variants the lexicon does not know (`balnce`, `acount`);
//! word n-grams carry phrases (`talk to`, `money never enter`).

/// Feature space: 2^16 hashed features (the weights, 3.4 MB for 13 intents, stay in cache).
const DIMS_LOG2: u32 = 16;
const DIMS: usize = 1 << DIMS_LOG2;
/// Passes over the examples: as many as make about `UPDATES` example updates, between the
/// bounds (a few hundred examples need 40 passes; more learn as much from fewer).
const EPOCHS: (usize, usize) = (10, 40);
const UPDATES: usize = 14_000;
const LEARNING_RATE: f32 = 0.5;

pub(super) struct Classifier {
    classes: usize,
    /// `weights[feature * classes + class]`: a feature's weights sit together for scoring.
    weights: Vec<f32>,
    bias: Vec<f32>,
}

impl Classifier {
    /// Trains on `(normalised text, class index)` pairs.
    pub(super) fn train(examples: &[(String, usize)], classes: usize) -> Classifier {
        let data: Vec<(Vec<u32>, usize)> = examples
            .iter()
            .map(|(text, class)| (features(text), *class))
            .collect();
        let mut model = Classifier {
            classes,
            weights: vec![0.0; DIMS * classes],
            bias: vec![0.0; classes],
        };
        let mut squared = vec![1e-2f32; DIMS * classes];
        let mut bias_squared = vec![1e-2f32; classes];
        let mut order: Vec<usize> = (0..data.len()).collect();
        let mut seed = 0x5eed_u64;
        let mut probs = vec![0.0f32; classes];
        let epochs = (UPDATES / data.len().max(1)).clamp(EPOCHS.0, EPOCHS.1);
        for _ in 0..epochs {
            shuffle(&mut order, &mut seed);
            for &i in &order {
                let (feats, class) = &data[i];
                model.probabilities_into(feats, &mut probs);
                let scale = feature_scale(feats.len());
                for c in 0..classes {
                    let gradient = probs[c] - if c == *class { 1.0 } else { 0.0 };
                    if gradient.abs() < 1e-4 {
                        continue;
                    }
                    bias_squared[c] += gradient * gradient;
                    model.bias[c] -= LEARNING_RATE * gradient / bias_squared[c].sqrt();
                    let g = gradient * scale;
                    for &f in feats {
                        let at = f as usize * classes + c;
                        squared[at] += g * g;
                        model.weights[at] -= LEARNING_RATE * g / squared[at].sqrt();
                    }
                }
            }
        }
        model
    }

    /// Probability of each class for a normalised text; they sum to 1.
    pub(super) fn probabilities(&self, text: &str) -> Vec<f32> {
        let mut probs = vec![0.0; self.classes];
        self.probabilities_into(&features(text), &mut probs);
        probs
    }

    fn probabilities_into(&self, feats: &[u32], probs: &mut [f32]) {
        probs.copy_from_slice(&self.bias);
        let scale = feature_scale(feats.len());
        for &f in feats {
            let row = &self.weights[f as usize * self.classes..][..self.classes];
            for (p, w) in probs.iter_mut().zip(row) {
                *p += w * scale;
            }
        }
        softmax(probs);
    }
}

/// Longer messages have more features; scaling keeps their scores comparable.
fn feature_scale(count: usize) -> f32 {
    1.0 / (count.max(1) as f32).sqrt()
}

fn softmax(scores: &mut [f32]) {
    let max = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut sum = 0.0;
    for s in scores.iter_mut() {
        *s = (*s - max).exp();
        sum += *s;
    }
    for s in scores.iter_mut() {
        *s /= sum;
    }
}

/// Word unigrams and bigrams, and character 3- to 5-grams of each word with its boundaries.
fn features(text: &str) -> Vec<u32> {
    let words: Vec<&str> = text.split_whitespace().collect();
    let mut out = Vec::with_capacity(words.len() * 12);
    for (i, word) in words.iter().enumerate() {
        out.push(hash(&[b"w", word.as_bytes()]));
        if let Some(next) = words.get(i + 1) {
            out.push(hash(&[b"b", word.as_bytes(), b" ", next.as_bytes()]));
        }
        if word.starts_with('<') {
            continue;
        }
        let padded: Vec<char> = std::iter::once(' ')
            .chain(word.chars())
            .chain(std::iter::once(' '))
            .collect();
        for n in 3..=5 {
            for gram in padded.windows(n) {
                let mut buf = [0u8; 24];
                let mut len = 0;
                for c in gram {
                    len += c.encode_utf8(&mut buf[len..]).len();
                }
                out.push(hash(&[b"c", &buf[..len]]));
            }
        }
    }
    out.sort_unstable();
    out.dedup();
    out
}

/// FNV-1a, folded into the feature space.
fn hash(parts: &[&[u8]]) -> u32 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for part in parts {
        for b in *part {
            h ^= u64::from(*b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
    }
    ((h ^ (h >> 32)) as u32) & (DIMS as u32 - 1)
}

fn shuffle(order: &mut [usize], seed: &mut u64) {
    for i in (1..order.len()).rev() {
        *seed = seed
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        let j = (*seed >> 33) as usize % (i + 1);
        order.swap(i, j);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn learns_separable_classes_and_generalises_to_misspellings() {
        let examples: Vec<(String, usize)> = [
            ("check my balance", 0),
            ("what is my account balance", 0),
            ("show me my balance please", 0),
            ("buy airtime for me", 1),
            ("i want to buy data", 1),
            ("recharge my line with airtime", 1),
        ]
        .iter()
        .map(|(t, c)| ((*t).to_owned(), *c))
        .collect();
        let model = Classifier::train(&examples, 2);
        let p = model.probabilities("abeg check my balnce");
        assert!(p[0] > 0.7, "{p:?}");
        let p = model.probabilities("buy me airtme");
        assert!(p[1] > 0.7, "{p:?}");
        assert!((p.iter().sum::<f32>() - 1.0).abs() < 1e-4);
    }
}
