"""A checkpoint's saved run config brought up to the current schema: the keys added since
it was saved take the schema's defaults, which keep what older versions did."""

from pretrain.config.validation import plain_config, run_config


def with_schema_defaults(saved: dict) -> dict:
    """A checkpoint's plain run config with the keys it lacks (added to the schema since it
    was saved) at the schema's defaults, which keep what older versions did; its own values
    unchanged. `saved` itself when it no longer validates (an old or foreign config)."""
    try:
        defaults = plain_config(run_config(saved))
    except Exception:  # noqa: BLE001 (then only its own keys count)
        return saved
    return merged(defaults, saved)


def merged(base: dict, own: dict) -> dict:
    """`base` with `own`'s values over it, nested dicts merged key by key (a new dict)."""
    out = dict(base)
    for key, value in own.items():
        both = isinstance(value, dict) and isinstance(base.get(key), dict)
        out[key] = merged(base[key], value) if both else value
    return out
