"""ApiVersions as the proxy advertises it: versions clamped to what the proxy decodes, and
the features' SupportedFeatures entries added.

Pure: takes a decoded response body, changes it in place and says whether it changed
anything, so the caller re-encodes only when it must.
"""

from __future__ import annotations

from proxy.protocol.message_types import ApiVersionsResponse


def clamp_api_versions(
    body: ApiVersionsResponse,
    known: dict[int, tuple[int, int]],
    features: dict[str, tuple[int, int]],
    new_feature: type[ApiVersionsResponse.SupportedFeatureKey] | None = None,
) -> bool:
    """Clamp the advertised versions of every key we decode to what our schemas know; add
    our features.

    ``known`` maps each api key the proxy decodes to the (min, max) its schemas know. A
    broker newer than our schemas could otherwise announce a version we cannot decode, and
    an older one a version below our schemas' floor. Keys not in ``known`` are passed on
    exactly as the broker advertises them.
    """
    changed = False
    for entry in body.api_keys or ():
        ours = known.get(entry.api_key)
        if ours is None:
            continue
        low, high = ours
        if entry.max_version > high:
            entry.max_version = max(high, entry.min_version)
            changed = True
        if entry.min_version < low <= entry.max_version:
            entry.min_version = low
            changed = True
    if features:
        present = {feature.name for feature in body.supported_features or ()}
        for name, (min_version, max_version) in features.items():
            if name in present or new_feature is None:
                continue
            if body.supported_features is None:
                body.supported_features = []
            body.supported_features.append(new_feature(name=name, min_version=min_version, max_version=max_version))
            changed = True
    return changed
