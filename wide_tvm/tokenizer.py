"""A Hugging Face model folder's tokenizer, with the `tokenizers` library (no model code runs): `tokenizer.json`,
and from `tokenizer_config.json` its chat template (jinja2, sandboxed, as transformers renders it), its
beginning-of-sequence token and end-of-sequence ids (with `generation_config.json`'s).

    tok = Tokenizer("Llama-3.1-8B-Instruct/")
    ids = tok.encode(tok.chat([{"role": "user", "content": "Hi"}]))
"""

from __future__ import annotations

import json
import os

from .errors import WideError


class Tokenizer:
    def __init__(self, folder: str):
        path = os.path.join(folder, "tokenizer.json")
        if not os.path.isfile(path):
            raise WideError(f"{folder}: no tokenizer.json (a Hugging Face model folder's fast tokenizer)")
        from tokenizers import Tokenizer as Fast

        try:
            self.fast = Fast.from_file(path)
        except Exception as err:  # noqa: BLE001 - a broken file is one line, not a Rust panic's traceback
            raise WideError(f"{path}: not a tokenizer file: {str(err).strip().splitlines()[0]}") from None
        config = _json(os.path.join(folder, "tokenizer_config.json"))
        generation = _json(os.path.join(folder, "generation_config.json"))
        self.folder = folder
        self.chat_template = config.get("chat_template")
        if isinstance(self.chat_template, list):  # (the named-templates form: the default one)
            self.chat_template = next((t["template"] for t in self.chat_template if t.get("name") == "default"),
                                      None)
        self.bos_token = _token_text(config.get("bos_token"))
        self.eos_token = _token_text(config.get("eos_token"))
        eos = generation.get("eos_token_id", [])
        eos = [eos] if isinstance(eos, int) else list(eos)
        if self.eos_token is not None and self.fast.token_to_id(self.eos_token) is not None:
            eos.append(self.fast.token_to_id(self.eos_token))
        self.eos_ids = tuple(sorted(set(eos)))
        self._template = None

    @property
    def vocab_size(self) -> int:
        return self.fast.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str, special: bool = True) -> list[int]:
        """Ids of `text`; `special`: with the tokenizer's own added tokens (a BOS where its post-processor adds one)."""
        return self.fast.encode(text, add_special_tokens=special).ids

    def decode(self, ids: list[int]) -> str:
        return self.fast.decode(list(ids), skip_special_tokens=True)

    def stream(self, context: list[int] = ()) -> "TextStream":
        return TextStream(self, context)

    def chat(self, messages: list[dict], add_generation_prompt: bool = True) -> str:
        """The prompt text of `messages` ([{"role", "content"}]) by the folder's chat template."""
        if not self.chat_template:
            raise WideError(f"{self.folder}: the tokenizer has no chat_template (tokenizer_config.json)")
        from jinja2 import TemplateError

        if self._template is None:
            from jinja2.sandbox import ImmutableSandboxedEnvironment

            def raise_exception(message):
                raise TemplateError(message)

            env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
            env.globals["raise_exception"] = raise_exception
            env.filters["tojson"] = lambda x, indent=None, **_: json.dumps(x, ensure_ascii=False, indent=indent)
            try:
                self._template = env.from_string(self.chat_template)
            except TemplateError as err:
                raise WideError(f"{self.folder}: chat_template does not parse: {err}") from None
        try:
            return self._template.render(messages=messages, add_generation_prompt=add_generation_prompt,
                                         bos_token=self.bos_token or "", eos_token=self.eos_token or "")
        except TemplateError as err:
            raise WideError(f"chat template: {err}") from None


class TextStream:
    """Text of a growing list of ids, a piece at a time (the incremental detokenisation of vLLM and TGI): `add(id)`
    returns the text the new id completes, nothing while the ids end inside a multi-byte character. `context`: the
    prompt's last ids, so the first piece keeps the space a word-initial token carries."""

    def __init__(self, tokenizer: Tokenizer, context: list[int] = ()):
        self.tok, self.ids = tokenizer, list(context)[-5:]
        self.prefix, self.read = 0, len(self.ids)

    def add(self, token: int) -> str:
        self.ids.append(token)
        before = self.tok.decode(self.ids[self.prefix:self.read])
        text = self.tok.decode(self.ids[self.prefix:])
        if len(text) <= len(before) or text.endswith("\ufffd"):
            return ""
        self.prefix, self.read = self.read, len(self.ids)
        return text[len(before):]


def _json(path: str) -> dict:
    if not os.path.isfile(path):
        return {}
    try:
        with open(path) as f:
            data = json.load(f)
    except (OSError, ValueError) as err:
        raise WideError(f"{path}: not JSON: {err}") from None
    return data if isinstance(data, dict) else {}


def _token_text(value) -> str | None:
    return value.get("content") if isinstance(value, dict) else value
