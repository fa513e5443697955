"""A tiny deterministic GGUF model ("bigram machine") for tests against a real llama.cpp server.

The network is wired so that the next token depends only on the previous one:

- token embeddings are one-hot (``n_embd`` >= vocabulary size);
- transformer blocks whose attention and feed-forward weights are all zero, so the residual
  stream reaches the output unchanged;
- ``output_norm`` is ``1/sqrt(n_embd)``: RMSNorm of a one-hot is ``sqrt(n_embd)`` at the hot
  position, so the product is the same one-hot again;
- ``output.weight[next, prev] = GAP`` for each wanted transition; any other token is followed
  by end-of-turn. A logit gap of 30 makes sampling deterministic at any sane temperature.

So the answer is decided by the last token of the prompt, and the chat template stored in the
GGUF (``CHAT_TEMPLATE``, Hermes/Qwen style) chooses that token:

- no tools offered: ``PLAIN_ANSWER`` "Hello from a tiny model.", finish "stop";
- tools offered, last message from the user: one call ``get_note({"key": "k"})`` in Hermes
  ``<tool_call>`` form, which llama.cpp (jinja on) parses into ``tool_calls``;
- last message a tool result: ``TOOL_ANSWER`` "I read the note.", finish "stop";
- the last user message has the word ``tick`` (whitespace-separated, anywhere; this wins over
  the rest): "tick tick tick ..." without end, until ``max_tokens`` (finish "length").

Prompts cost about one token per byte: the vocabulary has few words, the rest is byte fallback.
"""

from __future__ import annotations

import itertools
from pathlib import Path

PLAIN_ANSWER = "Hello from a tiny model."
TOOL_ANSWER = "I read the note."
TOOL_NAME = "get_note"
TOOL_ARGUMENTS = {"key": "k"}
TICK = "tick"  # the trigger word, and the word the endless answer repeats
# The one tool the model calls, as an OpenAI `tools` entry.
GET_NOTE_TOOL = {
    "type": "function",
    "function": {
        "name": TOOL_NAME,
        "description": "Read a note by its key.",
        "parameters": {
            "type": "object",
            "properties": {"key": {"type": "string"}},
            "required": ["key"],
        },
    },
}

# Logit of a wanted successor; every other logit is 0.
GAP = 30.0

SPECIALS = ["<unk>", "<s>", "</s>", "<|im_start|>", "<|im_end|>"]
# Markers the template puts at the very end of the prompt to pick the answer chain. They are
# user-defined tokens, which llama.cpp's tokenizer matches as a whole in any text.
MARK_PLAIN = "<|plain|>"
MARK_AFTER_TOOL = "<|after_tool|>"
MARK_TICK = "<|tick|>"
TOOL_OPEN = "<tool_call>"
TOOL_CLOSE = "</tool_call>"
# The call body in several tokens, so the arguments stream in pieces as with a real model.
TOOL_BODY = ['\n{"name": "get_note", "arguments": ', '{"key": ', '"k"', "}}\n"]
USER_DEFINED = [MARK_PLAIN, MARK_AFTER_TOOL, MARK_TICK, TOOL_OPEN, TOOL_CLOSE, *TOOL_BODY]
# SentencePiece words: "▁" stands for a leading space.
WORDS = ["Hello", "▁from", "▁a", "▁tiny", "▁model", ".", "I", "▁read", "▁the", "▁note"]
WORDS += [TICK, "▁" + TICK]

# Hermes/Qwen-style template. The markers at the end of the generation prompt steer the model;
# the tool-call case ends on the plain newline after "assistant", as Qwen's template does.
CHAT_TEMPLATE = (
    "{%- set last = messages[-1] -%}"
    "{%- if tools -%}"
    "{{- '<|im_start|>system\\n' -}}"
    "{%- if messages[0].role == 'system' -%}{{- messages[0].content + '\\n\\n' -}}{%- endif -%}"
    "{{- '# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n"
    "You are provided with function signatures within <tools></tools> XML tags:\\n<tools>' -}}"
    "{%- for tool in tools -%}{{- '\\n' + (tool | tojson) -}}{%- endfor -%}"
    "{{- '\\n</tools>\\n\\nFor each function call, return a json object with function name and "
    "arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n"
    '{"name": <function-name>, "arguments": <args-json-object>}\\n'
    "</tool_call><|im_end|>\\n' -}}"
    "{%- elif messages[0].role == 'system' -%}"
    "{{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' -}}"
    "{%- endif -%}"
    "{%- for message in messages -%}"
    "{%- if message.role == 'user' or (message.role == 'system' and not loop.first) -%}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' -}}"
    "{%- elif message.role == 'assistant' -%}"
    "{{- '<|im_start|>assistant' -}}"
    "{%- if message.content -%}{{- '\\n' + message.content -}}{%- endif -%}"
    "{%- if message.tool_calls -%}"
    "{%- for call in message.tool_calls -%}"
    "{%- set fn = call.function if call.function is defined else call -%}"
    '{{- \'\\n<tool_call>\\n{"name": "\' + fn.name + \'", "arguments": \' -}}'
    "{%- if fn.arguments is string -%}{{- fn.arguments -}}"
    "{%- else -%}{{- fn.arguments | tojson -}}{%- endif -%}"
    "{{- '}\\n</tool_call>' -}}"
    "{%- endfor -%}"
    "{%- endif -%}"
    "{{- '<|im_end|>\\n' -}}"
    "{%- elif message.role == 'tool' -%}"
    "{%- if loop.first or loop.previtem.role != 'tool' -%}{{- '<|im_start|>user' -}}{%- endif -%}"
    "{{- '\\n<tool_response>\\n' + message.content + '\\n</tool_response>' -}}"
    "{%- if loop.last or loop.nextitem.role != 'tool' -%}{{- '<|im_end|>\\n' -}}{%- endif -%}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}"
    "{{- '<|im_start|>assistant\\n' -}}"
    "{%- if last.role == 'user' and last.content is string and 'tick' in last.content.split() -%}"
    "{{- '<|tick|>' -}}"
    "{%- elif last.role == 'tool' -%}{{- '<|after_tool|>' -}}"
    "{%- elif not tools -%}{{- '<|plain|>' -}}"
    "{%- endif -%}"
    "{%- endif -%}"
)


def _vocab() -> tuple[list[str], list[int]]:
    import gguf

    tokens = list(SPECIALS) + list(USER_DEFINED)
    types = [gguf.TokenType.UNKNOWN] + [gguf.TokenType.CONTROL] * (len(SPECIALS) - 1)
    types += [gguf.TokenType.USER_DEFINED] * len(USER_DEFINED)
    # Byte fallback: any text tokenizes, whatever the vocabulary lacks.
    tokens += [f"<0x{b:02X}>" for b in range(256)]
    types += [gguf.TokenType.BYTE] * 256
    tokens += WORDS
    types += [gguf.TokenType.NORMAL] * len(WORDS)
    return tokens, [int(t) for t in types]


def _transitions() -> list[tuple[str, str]]:
    """The wanted (previous token, next token) pairs."""
    plain = [MARK_PLAIN, "Hello", "▁from", "▁a", "▁tiny", "▁model", ".", "<|im_end|>"]
    after_tool = [MARK_AFTER_TOOL, "I", "▁read", "▁the", "▁note", "."]
    # The tool-call prompt ends on the newline after "assistant", a byte-fallback token.
    tool = ["<0x0A>", TOOL_OPEN, *TOOL_BODY, TOOL_CLOSE, "<|im_end|>"]
    tick = [MARK_TICK, TICK, "▁" + TICK, "▁" + TICK]
    return [pair for chain in (plain, after_tool, tool, tick) for pair in itertools.pairwise(chain)]


def write_tiny_model(path: Path, *, n_layers: int = 1) -> Path:
    """Write the bigram machine to ``path`` (a ``.gguf`` file) and return ``path``.

    ``n_layers`` adds all-zero transformer blocks: they change no output, only slow each token
    down. Measured on 2 busy cores, server side, 500 tokens: 1 layer 6000-8000 tokens/s (2000-
    4000/s streamed), 4 layers ~3000/s, 8 ~2000/s, 16 ~350/s; a longer context slows all of them
    (at 2000 tokens: 6000, 1150, 290, 140/s). Noisy: a pace to rely on needs SIGSTOP/SIGCONT.
    """
    # Imported here so that the constants above import without them (tests skip cleanly).
    import gguf
    import numpy as np

    tokens, types = _vocab()
    ids = {t: i for i, t in enumerate(tokens)}
    n_vocab = len(tokens)
    n_embd = -(-n_vocab // 64) * 64  # one-hot embeddings need a width >= vocabulary
    head_dim = 64
    n_ff = 64
    f16, f32 = np.float16, np.float32  # 2-D weights in f16 (30 and 1 are exact), norms in f32

    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name("ferryman-tiny-bigram")
    writer.add_context_length(32768)
    writer.add_embedding_length(n_embd)
    writer.add_block_count(n_layers)
    writer.add_feed_forward_length(n_ff)
    writer.add_head_count(n_embd // head_dim)
    writer.add_head_count_kv(n_embd // head_dim)
    writer.add_rope_dimension_count(head_dim)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_F16)

    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores([0.0] * n_vocab)
    writer.add_token_types(types)
    writer.add_unk_token_id(ids["<unk>"])
    writer.add_bos_token_id(ids["<s>"])
    writer.add_eos_token_id(ids["<|im_end|>"])
    writer.add_eot_token_id(ids["<|im_end|>"])
    writer.add_add_bos_token(False)
    writer.add_add_eos_token(False)
    # SentencePiece would put a "▁" after every special token ("<|im_start|>▁assistant"); the
    # grammar of tool_choice "required" replays the generation prompt and fails on that.
    writer.add_add_space_prefix(False)
    writer.add_chat_template(CHAT_TEMPLATE)

    # numpy shapes are (rows, cols) = ggml's (ne1, ne0): weights are (out, in).
    writer.add_tensor("token_embd.weight", np.eye(n_vocab, n_embd, dtype=f16))
    writer.add_tensor("output_norm.weight", np.full(n_embd, 1 / np.sqrt(n_embd), dtype=f32))
    out = np.zeros((n_vocab, n_embd), dtype=f16)
    out[ids["<|im_end|>"], :n_vocab] = GAP  # by default, any token ends the turn
    for prev, nxt in _transitions():
        out[:, ids[prev]] = 0.0
        out[ids[nxt], ids[prev]] = GAP
    writer.add_tensor("output.weight", out)
    shapes = {
        "attn_q": (n_embd, n_embd),
        "attn_k": (n_embd, n_embd),
        "attn_v": (n_embd, n_embd),
        "attn_output": (n_embd, n_embd),
        "ffn_gate": (n_ff, n_embd),
        "ffn_up": (n_ff, n_embd),
        "ffn_down": (n_embd, n_ff),
    }
    for layer in range(n_layers):
        blk = f"blk.{layer}."
        writer.add_tensor(blk + "attn_norm.weight", np.ones(n_embd, dtype=f32))
        writer.add_tensor(blk + "ffn_norm.weight", np.ones(n_embd, dtype=f32))
        for name, shape in shapes.items():
            writer.add_tensor(f"{blk}{name}.weight", np.zeros(shape, dtype=f16))

    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
