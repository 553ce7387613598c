"""Which modules ``strategy="fsdp"`` shards as blocks, and the refusal of tied weights that the
sharding would split: checked before an FSDP run starts, without torch's FSDP2."""

from __future__ import annotations

from torch import nn


def blocks_to_shard(net: nn.Module, wrap: tuple[type, ...] = (), spelled: str = "FSDP(wrap=...)") -> list[nn.Module]:
    """The modules sharded before the root: those of ``wrap``'s classes, or each direct child holding parameters."""
    if not wrap:
        return [child for child in net.children() if any(True for _ in child.parameters())]
    blocks = [m for m in net.modules() if m is not net and isinstance(m, wrap)]
    if not blocks:
        names = ", ".join(cls.__name__ for cls in wrap)
        raise ValueError(
            f"{spelled.replace('...', '[' + names + ']')}: the net has no module of these classes. Pass the classes of its repeated "
            "blocks (e.g. FSDP(wrap=[nn.TransformerEncoderLayer])), or leave wrap out to shard each "
            "direct child of the net."
        )
    return blocks


def check_tied_parameters(net: nn.Module, blocks: list[nn.Module], wrap_given: bool) -> None:
    """Refuse one parameter (tied weights: an embedding shared with the output layer) that the sharding
    would put in two shards: each of ``blocks`` is a shard, the root takes what no block holds."""
    prefixes = sorted(
        (name for name, module in net.named_modules() if any(module is block for block in blocks)),
        key=len,
        reverse=True,  # the innermost block holding a parameter is its shard
    )
    names_of: dict[int, dict[str, str]] = {}  # id(parameter) -> {name: its shard's module name, "" for the root}
    for name, param in net.named_parameters(remove_duplicate=False):
        shard = next((prefix for prefix in prefixes if name.startswith(prefix + ".")), "")
        names_of.setdefault(id(param), {})[name] = shard
    split = [names for names in names_of.values() if len(set(names.values())) > 1]
    if not split:
        return
    names = split[0]
    shards = ", ".join(sorted({f"'{shard}'" if shard else "the root" for shard in names.values()}))
    tied_ids = {key for key, found in names_of.items() if len(found) > 1}
    classes = untied_block_classes(net, tied_ids)
    how = (
        "FSDP(wrap=[...]) shards the blocks of those classes"
        if wrap_given
        else ("strategy='fsdp' shards each direct child of the net on its own")
    )
    suggestion = ", ".join(cls.__name__ for cls in classes) if classes else "YourBlock"
    raise ValueError(
        f"{' and '.join(names)} are one parameter (tied weights), but {how}, which puts it in several shards "
        f"({shards}); a parameter can belong to one shard only. Pass strategy=kt.strategies.FSDP(wrap=[{suggestion}]), "
        "the classes of the net's blocks that hold no tied parameter: the root then keeps the tied ones."
    )


def untied_block_classes(net: nn.Module, tied_ids: set[int]) -> list[type]:
    """The classes of the net's repeated blocks (two instances or more) that hold no tied parameter,
    the outermost ones: what ``FSDP(wrap=[...])`` can shard while the root keeps the tied parameters."""
    containers = (nn.Sequential, nn.ModuleList, nn.ModuleDict)
    counts: dict[type, list[nn.Module]] = {}
    holders: set[type] = set()
    for module in net.modules():
        params = list(module.parameters())
        if module is net or isinstance(module, containers) or not params:
            continue
        if any(id(p) in tied_ids for p in params):
            holders.add(type(module))
        else:
            counts.setdefault(type(module), []).append(module)
    candidates = {cls: found for cls, found in counts.items() if len(found) >= 2 and cls not in holders}
    inner = {id(m) for found in candidates.values() for block in found for m in block.modules() if m is not block}
    return [cls for cls, found in candidates.items() if any(id(block) not in inner for block in found)]


__all__ = ["blocks_to_shard", "check_tied_parameters", "untied_block_classes"]
