"""A Hugging Face checkpoint's tokenizer and chat template as a `fp4rl.rl.codec.TextCodec`.

Read from the checkpoint folder with the libraries transformers itself uses underneath, without
transformers: `tokenizers` for tokenizer.json, jinja2 for the chat template, rendered the way
`apply_chat_template` renders it (sandboxed environment, trim_blocks and lstrip_blocks, the
loop-control extension, `raise_exception`, `tojson`, `strftime_now`; the special tokens as
variables) with `add_generation_prompt=True`, then encoded with `add_special_tokens=False` (the
template writes every special token itself).

Files, and what is taken from each:
- tokenizer.json (required): the vocabulary, merges, pre-tokenizer and added tokens;
- tokenizer_config.json: `chat_template` (a string, or a list of {name, template} from which
  "default" is used) and the special tokens (`eos_token`, `pad_token`, `bos_token`, ...);
  chat_template.jinja holds the template instead in newer folders; one of the two is required;
- generation_config.json and config.json: `eos_token_id` (an id or a list of ids).

Stop ids are every id those files name as end-of-sequence (generation_config.json's first: it is
what `generate` stops on), so a chat model stops at the end of its turn (`<|im_end|>`) and at the
end of text alike; `stop_ids` reads them for the server too, which also loads folders without a
chat template or a tokenizer. The padding id only fills positions the trainer masks out; it must
not be the sampler's EOS (a row would look stopped), so it is the tokenizer's pad token unless
that is the first stop id, and otherwise the smallest id that is no stop id.
"""

from __future__ import annotations

import datetime
import json
from pathlib import Path

import jinja2
import jinja2.ext
import jinja2.sandbox
import tokenizers

from fp4rl.rl.codec import until_stop

TOKENIZER_FILE = "tokenizer.json"
TOKENIZER_CONFIG = "tokenizer_config.json"
TEMPLATE_FILE = "chat_template.jinja"
_SPECIAL_TOKENS = ("bos_token", "eos_token", "pad_token", "unk_token")


def _read_json(path: Path) -> dict:
    if not path.is_file():
        return {}
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        raise ValueError(f"{path}: unreadable JSON ({err.msg} at line {err.lineno})") from None
    if not isinstance(value, dict):
        raise ValueError(f"{path}: expected a JSON object, found a {type(value).__name__}")
    return value


def _token_text(value) -> str | None:
    """A special token as tokenizer_config.json spells it: a string or an AddedToken dict."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


def _ids(value) -> list[int]:
    """eos_token_id of a config: an id, a list of ids, or null."""
    if value is None:
        return []
    return [int(v) for v in (value if isinstance(value, list) else [value])]


def _special_tokens(config: dict) -> dict[str, str]:
    """tokenizer_config.json's special tokens that it names, by name ("eos_token": "<|im_end|>")."""
    return {name: text for name in _SPECIAL_TOKENS if (text := _token_text(config.get(name))) is not None}


def _special_token_id(directory: Path, tokenizer: tokenizers.Tokenizer, special: dict[str, str],
                      name: str) -> int | None:
    if name not in special:
        return None
    found = tokenizer.token_to_id(special[name])
    if found is None:
        raise ValueError(f"{directory / TOKENIZER_CONFIG}: {name}={special[name]!r} is not in "
                         f"{directory / TOKENIZER_FILE}")
    return found


def stop_ids(directory: str | Path, tokenizer: tokenizers.Tokenizer | None = None) -> tuple[int, ...]:
    """Every end-of-sequence id the folder names, without repeats: generation_config.json's
    `eos_token_id`, then tokenizer_config.json's `eos_token` (only given the folder's `tokenizer`:
    a token's text needs the vocabulary to become an id), then config.json's `eos_token_id`.
    Empty when none of them names one."""
    directory = Path(directory)
    eos = None
    if tokenizer is not None:
        eos = _special_token_id(directory, tokenizer, _special_tokens(_read_json(directory / TOKENIZER_CONFIG)),
                                "eos_token")
    named = (_ids(_read_json(directory / "generation_config.json").get("eos_token_id"))
             + ([eos] if eos is not None else [])
             + _ids(_read_json(directory / "config.json").get("eos_token_id")))
    return tuple(dict.fromkeys(named))


def _raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def _tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def compile_template(source: str) -> jinja2.Template:
    env = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                                       extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.datetime.now().strftime(fmt)
    return env.from_string(source)


def _template_source(directory: Path, config: dict) -> str:
    template = config.get("chat_template")
    if isinstance(template, list):  # named templates: the "default" one is the chat template
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default")
    if isinstance(template, str) and template.strip():
        return template
    if (directory / TEMPLATE_FILE).is_file():
        return (directory / TEMPLATE_FILE).read_text(encoding="utf-8")
    raise ValueError(f"{directory}: no chat template; expected a `chat_template` string in {TOKENIZER_CONFIG} "
                     f"or a {TEMPLATE_FILE} file")


class HFCodec:
    """`encode_prompt(text)`: the chat template's single user turn plus the generation prompt, as ids;
    `decode(ids)`: the text up to the first stop id, special tokens skipped."""

    def __init__(self, directory: str, tokenizer: tokenizers.Tokenizer, template: jinja2.Template,
                 special_tokens: dict[str, str], stop_ids: tuple[int, ...], pad_id: int):
        self.name = f"hf:{directory}"
        self.tokenizer, self.template, self.special_tokens = tokenizer, template, special_tokens
        self.stop_ids, self.pad_id = stop_ids, pad_id
        self.vocab_size = tokenizer.get_vocab_size(with_added_tokens=True)
        unk = getattr(tokenizer.model, "unk_token", None)
        self._unk_id = tokenizer.token_to_id(unk) if unk else None

    @classmethod
    def from_dir(cls, directory: str | Path) -> "HFCodec":
        directory = Path(directory)
        path = directory / TOKENIZER_FILE
        if not path.is_file():
            raise ValueError(f"{path} not found: the checkpoint's tokenizer is read from a tokenizer.json "
                             "(the `tokenizers` format that Hugging Face folders ship)")
        try:
            tokenizer = tokenizers.Tokenizer.from_file(str(path))
        except Exception as err:  # tokenizers raises a bare Exception on a malformed file
            raise ValueError(f"{path}: not a readable tokenizers file ({str(err).splitlines()[0]})") from None
        config = _read_json(directory / TOKENIZER_CONFIG)
        template = compile_template(_template_source(directory, config))
        special = _special_tokens(config)
        stops = stop_ids(directory, tokenizer)
        if not stops:
            raise ValueError(f"{directory}: no end-of-sequence token: expected eos_token in {TOKENIZER_CONFIG} or "
                             "eos_token_id in generation_config.json or config.json (the sampler stops rows on it)")
        pad = _special_token_id(directory, tokenizer, special, "pad_token")
        if pad is None or pad == stops[0]:
            pad = next(i for i in range(len(stops) + 1) if i not in stops)
        return cls(str(directory), tokenizer, template, special, stops, pad)

    def render(self, prompt: str) -> str:
        """The chat template applied to one user message, with the generation prompt."""
        return self.render_messages([{"role": "user", "content": prompt}])

    def render_messages(self, messages: list[dict]) -> str:
        """The chat template applied to a conversation ({role, content} dicts), with the generation
        prompt: the text the model continues as the assistant (the server's chat route)."""
        try:
            return self.template.render(messages=messages, add_generation_prompt=True, **self.special_tokens)
        except jinja2.exceptions.TemplateError as err:
            raise ValueError(f"{self.name}: the chat template failed: {err}") from None

    def encode_prompt(self, prompt: str) -> list[int]:
        return self.tokenizer.encode(self.render(prompt), add_special_tokens=False).ids

    def decode(self, ids) -> str:
        return self.tokenizer.decode(until_stop(ids, self.stop_ids), skip_special_tokens=True)

    def is_encodable(self, text: str) -> bool:
        """False when the tokenizer maps part of `text` to its unknown token (a byte-level BPE has none)."""
        return self._unk_id is None or self._unk_id not in self.tokenizer.encode(text, add_special_tokens=False).ids
