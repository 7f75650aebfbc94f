#!/usr/bin/env python3
"""Makes the tiny data fixtures under tests/fixtures/data/ used by tests/test_dataset*.c:
an aclImdb-shaped folder and its .tar.gz (entries deliberately out of order), truncated/corrupt
archives, CSV/TSV/JSONL files and a collection of bad inputs. Deterministic; stdlib only."""
import gzip, io, os, random, shutil, tarfile

HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures", "data")

REVIEWS = {
    ("train", "pos"): [(0, 9, "A wonderful film, full of heart."), (2, 8, "Great acting and a clever plot!"),
                       (10, 10, "I loved every minute; the score is beautiful.")],
    ("train", "neg"): [(1, 2, "Dull and far too long."), (3, 1, "The worst movie I have seen this year."),
                       (7, 1, "  \n"),  # empty review: skipped and counted
                       (11, 3, b"Bad lighting \xff\xfe and invalid bytes.")],
    ("test", "pos"): [(0, 10, "Brilliant. Simply brilliant."), (5, 7, "Good fun for the whole family.")],
    ("test", "neg"): [(4, 2, "Boring <br /><br />and predictable."), (12, 4, "Not worth the ticket.")],
}


def write(path, data, mode="w"):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, mode + ("b" if isinstance(data, bytes) else ""), **({} if isinstance(data, bytes) else {"newline": ""})) as f:
        f.write(data)


def main():
    imdb = os.path.join(HERE, "imdb")
    shutil.rmtree(imdb, ignore_errors=True)
    members = []
    for (split, lab), items in REVIEWS.items():
        for i, r, text in items:
            rel = f"aclImdb/{split}/{lab}/{i}_{r}.txt"
            data = text if isinstance(text, bytes) else text.encode()
            write(os.path.join(imdb, rel), data)
            members.append((rel, data))
    extra = [("aclImdb/train/unsup/0_0.txt", b"unlabelled, ignored"), ("aclImdb/README", b"readme"),
             ("aclImdb/train/pos/notes.txt", b"not a review name, ignored")]
    for rel, data in extra:
        write(os.path.join(imdb, rel), data)
    members += extra
    random.Random(3).shuffle(members)  # archive order must not matter
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as tf:
        for rel, data in members:
            ti = tarfile.TarInfo(rel)
            ti.size, ti.mtime, ti.mode = len(data), 1700000000, 0o644
            tf.addfile(ti, io.BytesIO(data))
    gz = gzip.compress(buf.getvalue(), mtime=0)
    write(os.path.join(HERE, "imdb.tar.gz"), gz)
    write(os.path.join(HERE, "bad", "truncated.tar.gz"), gz[: len(gz) // 2])
    damaged = bytearray(buf.getvalue())
    damaged[3 * 1024 + 5] ^= 0x21  # 4th entry's header (each entry: 512 header + 512 data): bad checksum
    write(os.path.join(HERE, "bad", "damaged.tar.gz"), gzip.compress(bytes(damaged), mtime=0))
    corrupt = bytearray(gz)
    for k in range(len(corrupt) // 3, len(corrupt) // 3 + 64):
        corrupt[k] ^= 0x5A
    write(os.path.join(HERE, "bad", "corrupt.tar.gz"), bytes(corrupt))
    write(os.path.join(HERE, "bad", "nopos", "train", "neg", "1_1.txt"), "only negatives here")

    write(os.path.join(HERE, "kaggle.csv"),
          'review,sentiment\r\n'
          '"One of the best films, ""truly"" great.",positive\r\n'
          '"A mess.\nTwo lines of pure boredom.",negative\r\n'
          'Plain unquoted review,positive\r\n'
          '"",negative\r\n'  # empty review: skipped
          '"Caf\xc3\xa9 scenes were lovely",positive\r\n'.encode("latin-1").decode("latin-1"))
    write(os.path.join(HERE, "ints.tsv"), "sentence\tlabel\nit is fine\t1\nit is awful\t0\nmeh\t2\n")
    write(os.path.join(HERE, "reviews.jsonl"),
          '{"text": "great movie", "label": "pos"}\n\n{"text": "bad movie", "label": "neg"}\n'
          '{"text": "   ", "label": "neg"}\n{"text": "fine \\u00e9t\\u00e9", "label": "pos"}\n')
    write(os.path.join(HERE, "pairs.csv"), "premise,hypothesis,label\na man sleeps,a person rests,1\n"
          "the sky is green,grass is blue,0\n")
    write(os.path.join(HERE, "split", "train.csv"), "text,label\ngood,positive\nbad,negative\nnice,positive\n")
    write(os.path.join(HERE, "split", "test.csv"), "text,label\nawful,negative\ngreat,positive\n")
    bad = os.path.join(HERE, "bad")
    write(os.path.join(bad, "unknown_label", "train.csv"), "text,label\ngood,positive\nbad,negative\n")
    write(os.path.join(bad, "unknown_label", "test.csv"), "text,label\nok,positive\nso-so,neutral\n")
    write(os.path.join(bad, "missing_column.csv"), "body,label\nhello,1\n")
    write(os.path.join(bad, "unterminated.csv"), 'text,label\nfine,1\n"this quote\nnever ends,0\n')
    write(os.path.join(bad, "sparse_labels.csv"), "text,label\nfine,0\nstray,5000\nok,1\n")
    write(os.path.join(bad, "fields.csv"), "text,label\nfine,1\ntoo,many,fields\n")
    write(os.path.join(bad, "broken.jsonl"), '{"text": "a", "label": 1}\n{"text": "b", "label": 0}\n{"text": "c", \n')
    write(os.path.join(bad, "empty.csv"), "")
    write(os.path.join(bad, "only_empty.csv"), "text,label\n\" \",1\n")
    write(os.path.join(bad, "notes.txt"), "not a data file\n")


if __name__ == "__main__":
    main()
