"""Reference for scDINO's global weighted kNN (`pyscripts/global_kNN.py`), numpy + torch.

The algorithm is scDINO's, line for line, with the fixes the Rust version makes:
  * one label encoding fitted on ALL labels (scDINO fitted train and test separately);
  * a chunk of at least one test row (scDINO's `n_test // 100` is 0 below 100 test rows and
    `range(0, n, 0)` raises);
  * k clamped to the number of training rows (scDINO's topk raises);
  * top-2 looks at min(2, k, C) predictions (scDINO's narrow raised for a single class);
  * vote ties: `--sort stable` (default) sorts the votes with torch's stable descending sort
    (equal votes keep class order, lower code first); `--sort scdino` calls
    `probs.sort(1, True)` exactly as scDINO (identical to stable for <= 16 classes on CPU).

usage: knn_reference.py FEATURES_CSV LABELS_CSV SEED K[,K...] T [--sort MODE[,MODE]]
(MODE: stable | scdino) prints one line per MODE, each a JSON object {"sort", {"n_train", "n_test", "classes", "chunk", "results": [{"k", "k_used",
"top1", "top2", "total", "top1_percent", "top2_percent", "top1_rounded", "top2_rounded",
"confusion"}]}
"""
import json
import sys

import numpy as np
import torch


def main():
    feats_path, labels_path, seed, ks, temperature = sys.argv[1:6]
    sort_modes = ["stable"]
    if len(sys.argv) > 6:
        assert sys.argv[6] == "--sort", sys.argv[6]
        sort_modes = sys.argv[7].split(",")
        assert all(m in ("stable", "scdino") for m in sort_modes), sort_modes
    seed = int(seed)
    ks = [int(k) for k in ks.split(",")]
    temperature = float(temperature)

    features = np.genfromtxt(feats_path, delimiter=",")
    if features.ndim == 1:
        features = features.reshape(1, -1)
    with open(labels_path, encoding="utf-8") as f:
        class_labels = [line.rstrip("\r\n") for line in f.read().split("\n")]
    if class_labels and class_labels[-1] == "":
        class_labels.pop()
    assert len(class_labels) == features.shape[0], (len(class_labels), features.shape)

    for out in run(features, class_labels, seed, ks, temperature, sort_modes):
        print(json.dumps(out))


def run(features, class_labels, seed, ks, temperature, sort_modes=("stable",)):
    """The whole algorithm on in-memory data (what `main` does after reading the CSVs); the
    dtype of `features` (a numpy array) is the dtype the tensors are computed in. Returns one
    report dict per sort mode (the objects `main` prints)."""
    classes = np.unique(np.array(class_labels))
    codes = np.searchsorted(classes, np.array(class_labels))
    num_classes = len(classes)

    indices = np.arange(features.shape[0])
    np.random.seed(seed)
    np.random.shuffle(indices)
    features = features[indices]
    codes = codes[indices]
    n_tr = int(features.shape[0] * 0.8)
    train_features = torch.from_numpy(features[:n_tr, :])
    train_labels = torch.from_numpy(codes[:n_tr].astype(np.int64))
    test_features = torch.from_numpy(features[n_tr:, :])
    test_labels = torch.from_numpy(codes[n_tr:].astype(np.int64))

    @torch.no_grad()
    def knn_classifier(train_features, train_labels, test_features, test_labels, k, T, num_classes, sort_mode):
        top1, top2, total = 0.0, 0.0, 0
        confusion = np.zeros((num_classes, num_classes), dtype=np.int64)
        train_features = train_features.t()
        num_test_images, num_chunks = test_labels.shape[0], 100
        imgs_per_chunk = max(1, num_test_images // num_chunks)
        retrieval_one_hot = torch.zeros(k, num_classes).to(train_features.device)
        for idx in range(0, num_test_images, imgs_per_chunk):
            features = test_features[idx : min((idx + imgs_per_chunk), num_test_images), :]
            targets = test_labels[idx : min((idx + imgs_per_chunk), num_test_images)]
            batch_size = targets.shape[0]

            similarity = torch.mm(features, train_features)
            distances, indices = similarity.topk(k, largest=True, sorted=True)
            candidates = train_labels.view(1, -1).expand(batch_size, -1)
            retrieved_neighbors = torch.gather(candidates, 1, indices)

            retrieval_one_hot.resize_(batch_size * k, num_classes).zero_()
            retrieval_one_hot.scatter_(1, retrieved_neighbors.view(-1, 1), 1)
            distances_transform = distances.clone().div_(T).exp_()
            probs = torch.sum(
                torch.mul(
                    retrieval_one_hot.view(batch_size, -1, num_classes),
                    distances_transform.view(batch_size, -1, 1),
                ),
                1,
            )
            if sort_mode == "stable":
                _, predictions = torch.sort(probs, dim=1, descending=True, stable=True)
            else:
                _, predictions = probs.sort(1, True)

            correct = predictions.eq(targets.data.view(-1, 1))
            top1 = top1 + correct.narrow(1, 0, 1).sum().item()
            top2 = top2 + correct.narrow(1, 0, min(2, k, num_classes)).sum().item()
            total += targets.size(0)
            for y, p in zip(targets.tolist(), predictions[:, 0].tolist()):
                confusion[y, p] += 1
        return top1, top2, total, imgs_per_chunk, confusion

    return [
        report(sort_mode, ks, n_tr, classes, knn_classifier, train_features, train_labels,
               test_features, test_labels, temperature, num_classes)
        for sort_mode in sort_modes
    ]


def report(sort_mode, ks, n_tr, classes, knn_classifier, train_features, train_labels,
           test_features, test_labels, temperature, num_classes):
    results = []
    chunk = None
    for k in ks:
        k_used = min(k, n_tr)
        top1, top2, total, chunk, confusion = knn_classifier(
            train_features, train_labels, test_features, test_labels, k_used, temperature,
            num_classes, sort_mode
        )
        p1 = top1 * 100.0 / total
        p2 = top2 * 100.0 / total
        results.append(
            {
                "k": k,
                "k_used": k_used,
                "top1": int(top1),
                "top2": int(top2),
                "total": total,
                "top1_percent": p1,
                "top2_percent": p2,
                "top1_rounded": round(p1),
                "top2_rounded": round(p2),
                "confusion": confusion.tolist(),
            }
        )
    return {
        "sort": sort_mode,
        "n_train": n_tr,
        "n_test": int(test_labels.shape[0]),
        "classes": [str(c) for c in classes],
        "chunk": chunk,
        "results": results,
    }


if __name__ == "__main__":
    main()
