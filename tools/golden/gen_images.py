"""Golden data for io/image_decode and io/image_preprocess (tests/io/image/test_image.cpp).

Writes small test images to tests/data/images/ and, into tests/golden/images.safetensors, what
the reference pipeline makes of them. The reference is the one the PyTorch trainer runs
(docs/reference-trainer.md §3.2, §3.4):

  bytes --Energon SampleDecoder(image_decode="pil")--> PIL RGB image
        --transformers Qwen2VLImageProcessor (torchvision backend, the class Qwen3-VL/Qwen3.5
          configs name)--> pixel_values [N, 1536] float32, image_grid_thw [1, 3]

Tensors ("<group>.<case>.<name>"):
  decode.<file>.rgb           uint8 [H, W, 3]: the RGB array the processor works on, i.e. the
                              output of its own process_image() (PIL convert + alpha/transparency
                              handling) applied to the Energon-decoded image
  pre.<case>.pixel_values     float32 [N, 1536], pre.<case>.grid_thw int64 [1, 3],
  pre.<case>.min_max_pixels   int64 [2] (the processor's size.shortest_edge / longest_edge)
  smart_resize.inputs         int64 [K, 4] (H, W, min_pixels, max_pixels), factor 32
  smart_resize.outputs        int64 [K, 2] (h, w) or (-1, -1) where transformers raises
Metadata: pre.<case>.file (the image file), bad.<file> (the exception the reference raises for a
file it refuses), unsupported.<file> (a format the reference decodes but vlmtrain does not).

Run: python tools/golden/gen_images.py   (needs pillow, numpy, torch, torchvision, transformers,
megatron-energon). Everything is deterministic; keep the outputs small (the test data budget is
2 MiB for images + golden).
"""
import io
import os
import re
import struct
import sys
import zlib

import numpy as np
import PIL
import torch
import transformers
from megatron.energon.flavors.webdataset.sample_decoder import SampleDecoder
from PIL import Image
from safetensors.torch import save_file
from transformers.models.qwen2_vl.image_processing_qwen2_vl import (
    Qwen2VLImageProcessor,
    smart_resize,
)

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DATA_DIR = os.path.join(REPO, "tests", "data", "images")
GOLDEN = os.path.join(REPO, "tests", "golden", "images.safetensors")

# Qwen3-VL / Qwen3.5 preprocessor_config.json (docs/qwen-models.md §4); only the pixel budget is
# overridden per case so that outputs stay small.
QWEN_PREPROCESSOR = dict(
    patch_size=16,
    temporal_patch_size=2,
    merge_size=2,
    image_mean=[0.5, 0.5, 0.5],
    image_std=[0.5, 0.5, 0.5],
    do_convert_rgb=True,
)
QWEN_MIN_PIXELS, QWEN_MAX_PIXELS = 65536, 16777216
TRAINER_MAX_PIXELS = 1048576  # the reference trainer's AutoProcessor(max_pixels=...)

rng = np.random.default_rng(1234)


# ---------------------------------------------------------------------------------------------
# Test image content and writers


def synth_rgb(h, w):
    """Smooth gradients, a sinusoid, hard edges and mild noise: exercises resize and JPEG."""
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float64)
    r = 128 + 110 * np.sin(xx / 5.0 + yy / 9.0)
    g = 255 * (xx + yy) / max(1, w + h - 2)
    b = np.where(((xx // 7) + (yy // 5)) % 2 == 0, 40.0, 215.0)
    img = np.stack([r, g, b], axis=-1) + rng.normal(0, 6, (h, w, 3))
    return np.clip(np.rint(img), 0, 255).astype(np.uint8)


def png_chunk(tag, data):
    return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", zlib.crc32(tag + data))


ADAM7 = [(0, 0, 8, 8), (4, 0, 8, 8), (0, 4, 4, 8), (2, 0, 4, 4), (0, 2, 2, 4), (1, 0, 2, 2), (0, 1, 1, 2)]


def write_png(samples, bit_depth, color_type, palette=None, trns=None, interlace=False):
    """A minimal PNG encoder (filter 0), so every bit depth / colour type / tRNS form the format
    allows can be produced. samples: [H, W] or [H, W, C] integers (palette indices for type 3)."""
    samples = np.asarray(samples, dtype=np.int64)
    h, w = samples.shape[:2]
    channels = {0: 1, 2: 3, 3: 1, 4: 2, 6: 4}[color_type]
    samples = samples.reshape(h, w, channels)

    def scanline(row):  # row: [n, C]
        flat = row.reshape(-1)
        if bit_depth == 16:
            return b"\x00" + b"".join(struct.pack(">H", int(v)) for v in flat)
        if bit_depth == 8:
            return b"\x00" + bytes(int(v) for v in flat)
        per_byte = 8 // bit_depth
        out = bytearray()
        for i in range(0, len(flat), per_byte):
            byte = 0
            for k in range(per_byte):
                v = int(flat[i + k]) if i + k < len(flat) else 0
                byte |= v << (8 - bit_depth * (k + 1))
            out.append(byte)
        return b"\x00" + bytes(out)

    raw = b""
    if interlace:
        for x0, y0, dx, dy in ADAM7:
            sub = samples[y0::dy, x0::dx]
            if sub.shape[0] == 0 or sub.shape[1] == 0:
                continue
            raw += b"".join(scanline(sub[y]) for y in range(sub.shape[0]))
    else:
        raw = b"".join(scanline(samples[y]) for y in range(h))
    ihdr = struct.pack(">IIBBBBB", w, h, bit_depth, color_type, 0, 0, 1 if interlace else 0)
    out = b"\x89PNG\r\n\x1a\n" + png_chunk(b"IHDR", ihdr)
    if palette is not None:
        out += png_chunk(b"PLTE", bytes(np.asarray(palette, np.uint8).reshape(-1)))
    if trns is not None:
        out += png_chunk(b"tRNS", trns)
    return out + png_chunk(b"IDAT", zlib.compress(raw, 9)) + png_chunk(b"IEND", b"")


def pil_bytes(img, fmt, **kw):
    buf = io.BytesIO()
    img.save(buf, format=fmt, **kw)
    return buf.getvalue()


def make_files():
    """name -> bytes of every test image."""
    f = {}
    # JPEG (Pillow's encoder; libjpeg-turbo)
    f["tiny_20x20.jpg"] = pil_bytes(Image.fromarray(synth_rgb(20, 20)), "JPEG", quality=90)
    f["wide_97x31.jpg"] = pil_bytes(Image.fromarray(synth_rgb(31, 97)), "JPEG", quality=90)
    f["tall_45x130_444.jpg"] = pil_bytes(
        Image.fromarray(synth_rgb(130, 45)), "JPEG", quality=92, subsampling=0)
    f["odd_33x17_422.jpg"] = pil_bytes(
        Image.fromarray(synth_rgb(17, 33)), "JPEG", quality=88, subsampling=1)
    f["large_200x300.jpg"] = pil_bytes(Image.fromarray(synth_rgb(300, 200)), "JPEG", quality=75)
    f["progressive_61x47.jpg"] = pil_bytes(
        Image.fromarray(synth_rgb(47, 61)), "JPEG", quality=90, progressive=True)
    f["grey_40x28.jpg"] = pil_bytes(Image.fromarray(synth_rgb(28, 40)[..., 1]), "JPEG", quality=90)
    cmyk = np.concatenate([synth_rgb(24, 36), synth_rgb(24, 36)[..., :1]], axis=-1)
    f["cmyk_36x24.jpg"] = pil_bytes(Image.fromarray(cmyk, mode="CMYK"), "JPEG", quality=90)
    exif = Image.Exif()
    exif[0x0112] = 6  # orientation "rotate 90 CW": the reference does not apply it
    f["exif_rotated_48x32.jpg"] = pil_bytes(
        Image.fromarray(synth_rgb(32, 48)), "JPEG", quality=90, exif=exif.tobytes())
    f["exact_64x32.jpg"] = pil_bytes(Image.fromarray(synth_rgb(32, 64)), "JPEG", quality=90)

    # PNG written by Pillow (adaptive filters)
    f["rgb8_pil_57x23.png"] = pil_bytes(Image.fromarray(synth_rgb(23, 57)), "PNG")
    f["rgba8_pil_30x20.png"] = pil_bytes(
        Image.fromarray(np.concatenate([synth_rgb(20, 30), synth_rgb(20, 30)[..., :1]], -1), "RGBA"),
        "PNG")
    f["grey8_pil_25x15.png"] = pil_bytes(Image.fromarray(synth_rgb(15, 25)[..., 0]), "PNG")
    f["pal8_pil_50x70.png"] = pil_bytes(
        Image.fromarray(synth_rgb(70, 50)).quantize(colors=64), "PNG")

    # PNG written here: every bit depth and colour type, tRNS forms, interlacing
    g = lambda h, w, hi: rng.integers(0, hi, (h, w))  # noqa: E731
    f["grey1_9x5.png"] = write_png(g(5, 9, 2), 1, 0)
    f["grey2_11x6.png"] = write_png(g(6, 11, 4), 2, 0)
    f["grey4_13x7.png"] = write_png(g(7, 13, 16), 4, 0)
    f["grey8_25x15.png"] = write_png(synth_rgb(15, 25)[..., 2], 8, 0)
    g16 = g(9, 21, 65536)
    g16[0, :6] = [0, 1, 200, 255, 256, 300]  # PIL clips 16-bit grey to 255 instead of scaling
    f["grey16_21x9.png"] = write_png(g16, 16, 0)
    f["la8_14x10.png"] = write_png(g(10, 14, 256)[..., None].repeat(2, -1), 8, 4)
    f["la16_12x8.png"] = write_png(rng.integers(0, 65536, (8, 12, 2)), 16, 4)
    f["rgb8_19x13.png"] = write_png(synth_rgb(13, 19), 8, 2)
    f["rgb16_19x13.png"] = write_png(rng.integers(0, 65536, (13, 19, 3)), 16, 2)
    f["rgba8_16x9.png"] = write_png(rng.integers(0, 256, (9, 16, 4)), 8, 6)
    f["rgba16_17x11.png"] = write_png(rng.integers(0, 65536, (11, 17, 4)), 16, 6)
    pal = rng.integers(0, 256, (16, 3))
    pal[5] = pal[2]  # a duplicate colour: the reference's colour-key transparency hits both
    f["pal1_10x4.png"] = write_png(g(4, 10, 2), 1, 3, palette=pal[:2])
    f["pal2_9x5.png"] = write_png(g(5, 9, 4), 2, 3, palette=pal[:4])
    f["pal4_13x7.png"] = write_png(g(7, 13, 16), 4, 3, palette=pal)
    f["pal8_short_8x6.png"] = write_png(g(6, 8, 12), 8, 3, palette=pal[:10])  # index >= 10: black
    idx = g(7, 11, 8)
    idx[0, :3] = [2, 5, 3]
    f["pal_trns_key_11x7.png"] = write_png(idx, 8, 3, palette=pal[:8], trns=bytes([255, 255, 0]))
    f["pal_trns_alpha_11x7.png"] = write_png(idx, 8, 3, palette=pal[:8], trns=bytes([255, 128, 0]))
    gk = g(6, 10, 256)
    gk[0, :2] = 77
    f["grey8_trns_10x6.png"] = write_png(gk, 8, 0, trns=struct.pack(">H", 77))
    gk2 = g(6, 10, 4)
    f["grey2_trns_10x6.png"] = write_png(gk2, 2, 0, trns=struct.pack(">H", 2))
    f["grey1_trns0_10x6.png"] = write_png(g(6, 10, 2), 1, 0, trns=struct.pack(">H", 0))
    g16k = g(6, 10, 600)
    g16k[0, :3] = [0, 256, 100]
    f["grey16_trns256_10x6.png"] = write_png(g16k, 16, 0, trns=struct.pack(">H", 256))
    rk = rng.integers(0, 256, (6, 10, 3))
    rk[0, 0] = rk[3, 4] = [1, 2, 3]
    f["rgb8_trns_10x6.png"] = write_png(rk, 8, 2, trns=struct.pack(">HHH", 1, 2, 3))
    rk16 = rng.integers(0, 65536, (6, 10, 3))
    rk16[0, 0] = [0x1201, 0x3402, 0x5603]  # high bytes (0x12, 0x34, 0x56), low bytes (1, 2, 3)
    rk16[1, 1] = [0x0105, 0x0205, 0x0305]  # high bytes (1, 2, 3): hit by the low-byte key
    f["rgb16_trns_10x6.png"] = write_png(rk16, 16, 2, trns=struct.pack(">HHH", 0x0001, 0x0002, 0x0003))
    f["interlaced_rgb8_23x19.png"] = write_png(synth_rgb(19, 23), 8, 2, interlace=True)
    f["interlaced_pal2_7x5.png"] = write_png(g(5, 7, 4), 2, 3, palette=pal[:4], interlace=True)
    f["interlaced_grey16_3x2.png"] = write_png(g(2, 3, 256), 16, 0, interlace=True)

    # Chunk-level details where PIL and libpng differ by default
    good = write_png(synth_rgb(7, 9), 8, 2)
    iend = good.rindex(b"IEND") - 4
    f["no_iend_9x7.png"] = good[:iend]  # PIL does not need IEND
    idat = good.index(b"IDAT") - 4
    idat_len = struct.unpack(">I", good[idat:idat + 4])[0]
    crc_at = idat + 8 + idat_len
    f["cut_in_crc_9x7.png"] = good[: len(good) - 12 - 2]  # rows complete: PIL accepts it
    f["idat_bad_crc_9x7.png"] = good[:crc_at] + b"\0\0\0\0" + good[crc_at + 4:]  # PIL: unchecked
    text = png_chunk(b"tEXt", b"Comment\0hello")
    text = text[:-4] + b"\0\0\0\0"
    f["bad_ancillary_crc.png"] = good[:idat] + text + good[idat:]  # PIL checks it: refused

    # Input the reference refuses (each must raise there; the C++ decoder must refuse it too)
    jpg = f["large_200x300.jpg"]
    f["bad_truncated.jpg"] = jpg[: len(jpg) * 3 // 5]
    prog = f["progressive_61x47.jpg"]
    f["bad_truncated_progressive.jpg"] = prog[: len(prog) // 2]
    f["bad_header.jpg"] = b"\xff\xd8\xff\xe0" + bytes(rng.integers(0, 256, 200, dtype=np.uint8))
    png = f["rgb8_19x13.png"]
    f["bad_truncated.png"] = png[: len(png) * 3 // 5]
    f["bad_empty.png"] = b""
    f["bad_unknown.jpg"] = b"this is not an image, just text that ends up in a .jpg part\n"
    # IDAT with a damaged zlib stream (CRC recomputed so only the deflate data is wrong)
    broken = zlib.compress(b"\x00" + bytes(19 * 3), 9)
    broken = broken[:2] + b"\xff\xff\xff" + broken[5:]
    ihdr = struct.pack(">IIBBBBB", 19, 1, 8, 2, 0, 0, 0)
    f["bad_zlib.png"] = (b"\x89PNG\r\n\x1a\n" + png_chunk(b"IHDR", ihdr) + png_chunk(b"IDAT", broken)
                         + png_chunk(b"IEND", b""))
    # Formats the reference decodes (Pillow) but the C++ decoder does not
    f["unsupported_8x8.gif"] = pil_bytes(Image.fromarray(synth_rgb(8, 8)).quantize(8), "GIF")
    f["unsupported_8x8.bmp"] = pil_bytes(Image.fromarray(synth_rgb(8, 8)), "BMP")
    return f


# ---------------------------------------------------------------------------------------------
# The reference pipeline

DECODER = SampleDecoder(image_decode="pil")  # what the reference trainer's task encoders set


def processor(min_pixels, max_pixels):
    return Qwen2VLImageProcessor(
        **QWEN_PREPROCESSOR, size={"shortest_edge": min_pixels, "longest_edge": max_pixels})


def reference_rgb(name, data):
    """Energon decode + the processor's own RGB conversion, as uint8 [H, W, 3]."""
    img = DECODER.decode(name, data)
    chw = processor(QWEN_MIN_PIXELS, QWEN_MAX_PIXELS).process_image(img, do_convert_rgb=True)
    return img, chw.permute(1, 2, 0).contiguous()


# (case, file, min_pixels, max_pixels): small pixel budgets keep pixel_values small.
PREPROCESS_CASES = [
    ("tiny_upscale", "tiny_20x20.jpg", 4096, 8192),        # below min_pixels: scaled up
    ("wide", "wide_97x31.jpg", 1024, 4096),
    ("tall", "tall_45x130_444.jpg", 1024, 4096),
    ("odd", "odd_33x17_422.jpg", 1024, 4096),
    ("large_downscale", "large_200x300.jpg", 1024, 4096),  # above max_pixels: antialiased
    ("exact_no_resize", "exact_64x32.jpg", 1024, 4096),     # already a multiple of 32
    ("palette_png", "pal8_pil_50x70.png", 1024, 4096),
    ("cmyk", "cmyk_36x24.jpg", 1024, 2048),
    ("grey16_png", "grey16_21x9.png", 512, 1024),
]


def smart_resize_table():
    sizes = [(1, 1), (1, 200), (1, 201), (2, 300), (3, 700), (16, 16), (16, 48), (48, 80),
             (80, 112), (20, 20), (31, 97), (130, 45), (224, 224), (240, 320), (256, 256),
             (300, 200), (480, 640), (768, 1024), (1024, 768), (1080, 1920), (1920, 1080),
             (2048, 2048), (3000, 4000), (4096, 4096), (4097, 4095), (5000, 5000), (8000, 40),
             (40, 8000), (8000, 41), (100, 20000), (101, 20000), (12345, 678), (16384, 16384)]
    sizes += [tuple(int(v) for v in rng.integers(1, 6000, 2)) for _ in range(150)]
    sizes += [tuple(int(v) for v in rng.integers(1, 300, 2)) for _ in range(60)]
    configs = [(QWEN_MIN_PIXELS, QWEN_MAX_PIXELS), (QWEN_MIN_PIXELS, TRAINER_MAX_PIXELS),
               (1024, 4096), (4096, 4096), (3136, 1003520)]
    inputs, outputs = [], []
    for h, w in sizes:
        for mn, mx in configs:
            try:
                rh, rw = smart_resize(h, w, factor=32, min_pixels=mn, max_pixels=mx)
            except ValueError:
                rh, rw = -1, -1
            inputs.append([h, w, mn, mx])
            outputs.append([rh, rw])
    return torch.tensor(inputs, dtype=torch.int64), torch.tensor(outputs, dtype=torch.int64)


def main():
    os.makedirs(DATA_DIR, exist_ok=True)
    for old in os.listdir(DATA_DIR):
        os.remove(os.path.join(DATA_DIR, old))
    files = make_files()
    for name, data in files.items():
        with open(os.path.join(DATA_DIR, name), "wb") as fh:
            fh.write(data)

    tensors, meta = {}, {}
    pil_images = {}
    for name, data in files.items():
        try:
            img, rgb = reference_rgb(name, data)
        except Exception as e:  # noqa: BLE001 - recorded: the C++ decoder must refuse these too
            assert name.startswith("bad_"), f"reference failed on {name}: {e!r}"
            cause = e.__cause__ or e.__context__ or e  # Energon/webdataset wrap PIL's error
            msg = re.sub(r" at 0x[0-9a-f]+", "", str(cause))  # no object addresses: deterministic
            meta[f"bad.{name}"] = f"{type(cause).__name__}: {msg}"[:200]
            continue
        assert not name.startswith("bad_"), f"reference accepted {name}"
        if name.startswith("unsupported_"):
            meta[f"unsupported.{name}"] = f"reference decodes it as {img.mode} {img.size}"
            continue
        pil_images[name] = img
        tensors[f"decode.{name}.rgb"] = rgb

    for case, name, mn, mx in PREPROCESS_CASES:
        out = processor(mn, mx)(images=[pil_images[name]], return_tensors="pt")
        tensors[f"pre.{case}.pixel_values"] = out["pixel_values"].to(torch.float32)
        tensors[f"pre.{case}.grid_thw"] = out["image_grid_thw"].to(torch.int64)
        tensors[f"pre.{case}.min_max_pixels"] = torch.tensor([mn, mx], dtype=torch.int64)
        meta[f"pre.{case}.file"] = name

    tensors["smart_resize.inputs"], tensors["smart_resize.outputs"] = smart_resize_table()

    meta.update({
        "generator": os.path.relpath(os.path.abspath(sys.argv[0]), REPO),
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "pillow": PIL.__version__,
        "processor": "Qwen2VLImageProcessor (torchvision backend)",
    })
    save_file({k: v.contiguous() for k, v in tensors.items()}, GOLDEN, metadata=meta)
    data_bytes = sum(len(d) for d in files.values())
    print(f"wrote {len(files)} images ({data_bytes / 1024:.1f} KiB) to {DATA_DIR}")
    print(f"wrote {GOLDEN}: {len(tensors)} tensors, {os.path.getsize(GOLDEN) / 1024:.1f} KiB")
    for k, v in meta.items():
        if k.startswith(("bad.", "unsupported.")):
            print(f"  {k}: {v}")


if __name__ == "__main__":
    main()
