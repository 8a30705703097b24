"""Our transformations of vLLM 0.16.x/0.17.x sources so Kimi-K2.5 / DeepSeek run as EAGLE-3 targets.

Each patch locates the code it changes by a precise anchor (an AST node or an exact statement), marks what it
adds with ``# specdeploy-patch: <id>`` (so a second apply is a byte-identical no-op), reports ``upstream`` when
the release already has the fix, and refuses, naming file and anchor, when the expected code is not there.
All patched files are compiled before anything is written; nothing is written if any patch fails.
"""
from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

MARK = "# specdeploy-patch:"


class PatchError(RuntimeError):
    def __init__(self, file: str, anchor: str, why: str):
        self.file, self.anchor, self.why = file, anchor, why
        super().__init__(f"{file}: anchor '{anchor}' {why}")


@dataclass
class PatchResult:
    id: str
    status: str  # upstream | applied | needed | patched | drift
    files: list[str]
    detail: str = ""


def _mark(pid: str) -> str:
    return f"{MARK} {pid}"


def _lines(text: str) -> list[str]:
    return text.splitlines(keepends=True)


def _indent(line: str) -> str:
    return line[: len(line) - len(line.lstrip())]


def _class(tree: ast.AST, name: str, file: str) -> ast.ClassDef:
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name == name:
            return node
    raise PatchError(file, f"class {name}", "not found")


def _method(cls: ast.ClassDef, name: str, file: str) -> ast.FunctionDef:
    for node in cls.body:
        if isinstance(node, ast.FunctionDef) and node.name == name:
            return node
    raise PatchError(file, f"{cls.name}.{name}", "not found")


def _base_names(cls: ast.ClassDef) -> list[str]:
    return [b.id if isinstance(b, ast.Name) else ast.unparse(b) for b in cls.bases]


def _add_base(text: str, cls: ast.ClassDef, base: str, pid: str) -> str:
    """Insert ``, base`` after the last base of ``cls``."""
    last = cls.bases[-1]
    lines = _lines(text)
    row = lines[last.end_lineno - 1]
    col = len(row.encode()[: last.end_col_offset].decode())
    lines[last.end_lineno - 1] = row[:col] + f", {base}" + row[col:]
    # mark the class line
    hdr = cls.lineno - 1
    if _mark(pid) not in lines[hdr]:
        lines[hdr] = lines[hdr].rstrip("\n") + f"  {_mark(pid)}\n"
    return "".join(lines)


def _add_import(text: str, tree: ast.Module, module: str, name: str, pid: str, file: str) -> str:
    """Add ``from <module> import <name>`` after the existing import from that module."""
    imp = next((n for n in tree.body if isinstance(n, ast.ImportFrom) and n.module and
                (n.module == module.lstrip(".") or n.module.endswith(module.lstrip(".")))
                and any(a.name.startswith("Supports") for a in n.names)), None)
    if imp is None:
        raise PatchError(file, f"from {module} import ...", "not found")
    if any(a.name == name for a in imp.names):
        return text
    lines = _lines(text)
    prefix = "." * imp.level + (imp.module or "")
    lines.insert(imp.end_lineno, f"from {prefix} import {name}  {_mark(pid)}\n")
    return "".join(lines)


# --- 1. target whitelist --------------------------------------------------------------------------------
WHITELIST_ID = "vllm-eagle3-target-whitelist"
WHITELIST_FILE = "vllm/config/speculative.py"
WHITELIST_RX = re.compile(r"^(?P<ind>[ \t]+)(?P<name>eagle3_target_supported|aux_hidden_states_supported) = \[\n"
                          r"(?P<body>(?:(?!(?P=ind)\]).*\n)*?)(?P=ind)\]\n", re.M)
WHITELIST_ADD = ("deepseek_v2", "deepseek_v3", "kimi_k2", "kimi_k25")


def whitelist_status(text: str) -> str:
    m = WHITELIST_RX.search(text)
    if m is None:
        return "upstream" if "is only supported for" not in text else "drift"
    if _mark(WHITELIST_ID) in m.group("body"):
        return "applied"
    if all(f'"{x}"' in m.group("body") for x in WHITELIST_ADD):
        return "upstream"
    return "needed"


def whitelist_apply(text: str) -> str:
    m = WHITELIST_RX.search(text)
    if m is None:
        raise PatchError(WHITELIST_FILE, "eagle3_target_supported/aux_hidden_states_supported = [", "not found")
    item_ind = m.group("ind") + "    "
    add = "".join(f'{item_ind}"{x}",  {_mark(WHITELIST_ID)}\n' for x in WHITELIST_ADD
                  if f'"{x}"' not in m.group("body"))
    end = m.end() - len(m.group("ind")) - 2  # before the closing bracket line
    return text[:end] + add + text[end:]


# --- 2. image token -------------------------------------------------------------------------------------
IMAGE_ID = "vllm-kimi-image-token"
IMAGE_FILES = ("vllm/v1/spec_decode/eagle.py", "vllm/v1/spec_decode/llm_base_proposer.py")
IMAGE_ANCHOR = re.compile(r'^(?P<ind>[ \t]+)elif self\.get_model_name\(target_model\) == '
                          r'"PixtralForConditionalGeneration":\n', re.M)


def image_status(text: str) -> str:
    if _mark(IMAGE_ID) in text:
        return "applied"
    if "KimiK25ForConditionalGeneration" in text and "media_placeholder_token_id" in text:
        return "upstream"
    return "needed" if IMAGE_ANCHOR.search(text) else "drift"


def image_apply(text: str, file: str) -> str:
    m = IMAGE_ANCHOR.search(text)
    if m is None:
        raise PatchError(file, 'elif ... == "PixtralForConditionalGeneration":', "not found")
    ind = m.group("ind")
    block = (f'{ind}elif self.get_model_name(target_model) == "KimiK25ForConditionalGeneration":  '
             f"{_mark(IMAGE_ID)}\n"
             f"{ind}    # Kimi-K2.5 names its media token media_placeholder_token_id\n"
             f"{ind}    self.model.config.image_token_index = target_model.config.media_placeholder_token_id\n")
    return text[:m.start()] + block + text[m.start():]


# --- 3. SupportsEagle3 on DeepSeek and Kimi-K2.5 -----------------------------------------------------------
EAGLE3_ID = "vllm-deepseek-supports-eagle3"
DS_FILE = "vllm/model_executor/models/deepseek_v2.py"
KIMI_FILE = "vllm/model_executor/models/kimi_k25.py"


def eagle3_status(ds_text: str, kimi_text: str | None) -> str:
    if _mark(EAGLE3_ID) in ds_text:
        return "applied"
    try:
        cls = _class(ast.parse(ds_text), "DeepseekV2ForCausalLM", DS_FILE)
    except PatchError:
        return "drift"
    if "SupportsEagle3" in _base_names(cls):
        kimi_ok = kimi_text is None or "SupportsEagle3" in kimi_text
        return "upstream" if kimi_ok else "needed"
    return "needed"


def _patch_deepseek_forward(text: str, file: str) -> str:
    tree = ast.parse(text)
    model = _class(tree, "DeepseekV2Model", file)
    fwd = _method(model, "forward", file)
    loop = next((n for n in fwd.body if isinstance(n, ast.For) and isinstance(n.target, ast.Name)
                 and "self.layers" in ast.unparse(n.iter)), None)
    if loop is None:
        raise PatchError(file, "DeepseekV2Model.forward: for layer in islice(self.layers, ...)", "not found")
    ret = fwd.body[-1]
    if not (isinstance(ret, ast.Return) and isinstance(ret.value, ast.Name) and ret.value.id == "hidden_states"):
        raise PatchError(file, "DeepseekV2Model.forward: final 'return hidden_states'", "not found")
    lines = _lines(text)
    ind = _indent(lines[loop.lineno - 1])
    body_ind = _indent(lines[loop.body[0].lineno - 1])
    var = loop.target.id
    mk = _mark(EAGLE3_ID)
    # the return first (later in the file), then the loop, so line numbers stay valid
    r_ind = _indent(lines[ret.lineno - 1])
    lines.insert(ret.lineno - 1, f"{r_ind}if aux_hidden_states:  {mk}\n"
                                 f"{r_ind}    return hidden_states, aux_hidden_states\n")
    head = (f"{ind}aux_hidden_states = []  {mk}\n"
            f"{ind}for aux_idx, {var} in enumerate({ast.unparse(loop.iter)}):  {mk}\n"
            f"{body_ind}if aux_idx in self.aux_hidden_state_layers:  {mk}\n"
            f"{body_ind}    aux_hidden_states.append(\n"
            f"{body_ind}        hidden_states + residual if residual is not None else hidden_states\n"
            f"{body_ind}    )\n")
    header_end = loop.body[0].lineno - 1  # the for-header may span lines
    lines[loop.lineno - 1:header_end] = [head]
    text = "".join(lines)
    # class-level default so models built without set_aux_hidden_state_layers behave as before
    tree = ast.parse(text)
    model = _class(tree, "DeepseekV2Model", file)
    lines = _lines(text)
    first = model.body[0]
    f_ind = _indent(lines[first.lineno - 1])
    lines.insert(first.lineno - 1, f"{f_ind}aux_hidden_state_layers: tuple[int, ...] = ()  {mk}\n")
    return "".join(lines)


def _insert_methods(text: str, cls_name: str, before: str, methods: str, file: str) -> str:
    cls = _class(ast.parse(text), cls_name, file)
    anchor = _method(cls, before, file)
    first = anchor.decorator_list[0].lineno if anchor.decorator_list else anchor.lineno
    lines = _lines(text)
    ind = _indent(lines[anchor.lineno - 1])
    block = "".join((ind + line if line.strip() else line) for line in _lines(methods)) + "\n"
    lines.insert(first - 1, block)
    return "".join(lines)


DS_METHODS = f"""def set_aux_hidden_state_layers(self, layers: tuple[int, ...]) -> None:  {_mark(EAGLE3_ID)}
    self.model.aux_hidden_state_layers = layers

def get_eagle3_aux_hidden_state_layers(self) -> tuple[int, ...]:  {_mark(EAGLE3_ID)}
    n_layers = len(self.model.layers)
    return (2, n_layers // 2, n_layers - 3)
"""

KIMI_METHODS = f"""def set_aux_hidden_state_layers(self, layers: tuple[int, ...]) -> None:  {_mark(EAGLE3_ID)}
    self.language_model.set_aux_hidden_state_layers(layers)

def get_eagle3_aux_hidden_state_layers(self) -> tuple[int, ...]:  {_mark(EAGLE3_ID)}
    return self.language_model.get_eagle3_aux_hidden_state_layers()
"""


def eagle3_apply_deepseek(text: str) -> str:
    tree = ast.parse(text)
    text = _add_import(text, tree, ".interfaces", "SupportsEagle3", EAGLE3_ID, DS_FILE)
    cls = _class(ast.parse(text), "DeepseekV2ForCausalLM", DS_FILE)
    if "SupportsEagle" not in _base_names(cls):
        raise PatchError(DS_FILE, "class DeepseekV2ForCausalLM(..., SupportsEagle)", "has no SupportsEagle base")
    text = _add_base(text, cls, "SupportsEagle3", EAGLE3_ID)
    text = _insert_methods(text, "DeepseekV2ForCausalLM", "forward", DS_METHODS, DS_FILE)
    return _patch_deepseek_forward(text, DS_FILE)


def eagle3_apply_kimi(text: str) -> str:
    tree = ast.parse(text)
    text = _add_import(text, tree, "vllm.model_executor.models.interfaces", "SupportsEagle3", EAGLE3_ID, KIMI_FILE)
    cls = _class(ast.parse(text), "KimiK25ForConditionalGeneration", KIMI_FILE)
    text = _add_base(text, cls, "SupportsEagle3", EAGLE3_ID)
    return _insert_methods(text, "KimiK25ForConditionalGeneration", "forward", KIMI_METHODS, KIMI_FILE)


# --- driver ------------------------------------------------------------------------------------------------
def _read(root: Path, rel: str) -> str | None:
    p = root / rel
    return p.read_text() if p.is_file() else None


def status(root: Path) -> list[PatchResult]:
    if not (root / "vllm" / "__init__.py").is_file():
        raise PatchError(str(root), "vllm/__init__.py", "not found: --root must hold the vllm package")
    out = []
    sp = _read(root, WHITELIST_FILE)
    out.append(PatchResult(WHITELIST_ID, whitelist_status(sp) if sp is not None else "drift", [WHITELIST_FILE]))
    img_file = next((f for f in IMAGE_FILES if (t := _read(root, f)) is not None and
                     ("image_token_index" in t)), None)
    if img_file is None:
        out.append(PatchResult(IMAGE_ID, "upstream", [], "no image_token_index chain (MRV2-only release)"))
    else:
        out.append(PatchResult(IMAGE_ID, image_status(_read(root, img_file)), [img_file]))
    ds, kimi = _read(root, DS_FILE), _read(root, KIMI_FILE)
    out.append(PatchResult(EAGLE3_ID, eagle3_status(ds, kimi) if ds is not None else "drift",
                           [DS_FILE] + ([KIMI_FILE] if kimi is not None else [])))
    return out


def apply(root: Path) -> list[PatchResult]:
    """Apply every needed patch. All or nothing: files are compiled in memory before any is written."""
    results = status(root)
    drift = [r for r in results if r.status == "drift"]
    if drift:
        r = drift[0]
        raise PatchError(r.files[0] if r.files else str(root), r.id, "expected upstream code is not there (drift)")
    new: dict[str, str] = {}
    for r in results:
        if r.status != "needed":
            continue
        if r.id == WHITELIST_ID:
            new[WHITELIST_FILE] = whitelist_apply(_read(root, WHITELIST_FILE))
        elif r.id == IMAGE_ID:
            new[r.files[0]] = image_apply(_read(root, r.files[0]), r.files[0])
        elif r.id == EAGLE3_ID:
            ds = _read(root, DS_FILE)
            if "SupportsEagle3" not in _base_names(_class(ast.parse(ds), "DeepseekV2ForCausalLM", DS_FILE)):
                new[DS_FILE] = eagle3_apply_deepseek(ds)
            kimi = _read(root, KIMI_FILE)
            if kimi is not None and "SupportsEagle3" not in kimi:
                new[KIMI_FILE] = eagle3_apply_kimi(kimi)
        r.status = "patched"
    for rel, text in new.items():
        try:
            compile(text, rel, "exec")
        except SyntaxError as exc:
            raise PatchError(rel, f"line {exc.lineno}", f"patched file does not compile: {exc.msg}") from None
    for rel, text in new.items():
        (root / rel).write_text(text)
    return results
