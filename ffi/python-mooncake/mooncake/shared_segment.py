"""``mooncake.shared_segment`` over Crescent: ``create_shared_segment`` (named blocks of torch
tensors in one shared host segment), ``SharedSegment``, ``SharedSegmentError``,
``shared_segment_supported``. torch is imported when a segment is created, not here."""

from crescent.shared_segment import SharedSegment, SharedSegmentError, create_shared_segment, shared_segment_supported

__all__ = ["SharedSegment", "SharedSegmentError", "create_shared_segment", "shared_segment_supported"]
