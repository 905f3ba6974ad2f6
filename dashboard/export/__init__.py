"""Exports of a Report to other viewers: the Perfetto TrackEvent protobuf and Chrome trace JSON."""
