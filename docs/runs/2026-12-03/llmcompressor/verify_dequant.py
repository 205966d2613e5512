"""Manual dequantization of a compressed-tensors pack-quantized (int4) checkpoint,
checked against compressed-tensors' own decompression."""
import sys, json, torch
from safetensors import safe_open

def unpack_int4_rows(packed: torch.Tensor, n_cols: int) -> torch.Tensor:
    """packed int32 [rows, ceil(n_cols/8)] -> int8 [rows, n_cols] in [-8, 7].
    Column j lives in word j//8, bits 4*(j%8)..4*(j%8)+3 (column 0 = least-significant nibble).
    Nibbles are stored unsigned with +8 offset."""
    shifts = torch.arange(0, 32, 4, dtype=torch.int32)                      # [8]
    nib = (packed.unsqueeze(-1) >> shifts) & 0xF                            # [rows, words, 8]
    return (nib.reshape(packed.shape[0], -1)[:, :n_cols] - 8).to(torch.int8)

def dequant_linear(f, prefix: str, group_size: int, symmetric: bool) -> torch.Tensor:
    packed = f.get_tensor(prefix + ".weight_packed")                       # int32 [out, in/8]
    scale = f.get_tensor(prefix + ".weight_scale")                         # bf16  [out, in/gs]
    out_f, in_f = f.get_tensor(prefix + ".weight_shape").tolist()
    q = unpack_int4_rows(packed, in_f).to(torch.float32)                   # [out, in]
    if symmetric:
        zp = torch.zeros_like(scale, dtype=torch.float32)
    else:  # zero point packed along dim 0 (output rows): int32 [ceil(out/8), in/gs]
        zpp = f.get_tensor(prefix + ".weight_zero_point")
        zp = unpack_int4_rows(zpp.T.contiguous(), out_f).T.to(torch.float32)  # [out, in/gs]
    n_groups = scale.shape[1]
    qg = q.view(out_f, n_groups, -1)                                        # group along input dim
    w = (qg - zp.unsqueeze(-1)) * scale.to(torch.float32).unsqueeze(-1)
    return w.reshape(out_f, in_f).to(scale.dtype)                          # CT returns scale dtype

if __name__ == "__main__":
    folder = sys.argv[1]
    qc = json.load(open(folder + "/config.json"))["quantization_config"]
    wargs = qc["config_groups"]["group_0"]["weights"]
    gs, sym = wargs["group_size"], wargs["symmetric"]
    from transformers import AutoModelForCausalLM, CompressedTensorsConfig
    # dequantize=True -> compressed_tensors ModelCompressor.decompress_model() runs at load time
    ref = AutoModelForCausalLM.from_pretrained(
        folder, dtype="auto", quantization_config=CompressedTensorsConfig(dequantize=True))
    refsd = ref.state_dict()
    worst = 0.0
    with safe_open(folder + "/model.safetensors", "pt") as f:
        prefixes = sorted({k.rsplit(".", 1)[0] for k in f.keys() if k.endswith(".weight_packed")})
        for p in prefixes:
            mine = dequant_linear(f, p, gs, sym)
            theirs = refsd[p + ".weight"]
            d = (mine.float() - theirs.float()).abs().max().item()
            worst = max(worst, d)
        print(f"{folder}: {len(prefixes)} linears, ref dtype {theirs.dtype}, "
              f"ref module type {type(ref.get_submodule(prefixes[0])).__name__}, "
              f"max|manual - CT| = {worst:.3e}")
