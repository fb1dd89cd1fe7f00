"""lrukit: an LRU cache, a ring buffer, a min-heap and a sorted list."""

from lrukit.heap import MinHeap
from lrukit.lru import LRUCache
from lrukit.ring import RingBuffer
from lrukit.sortedlist import SortedList

__all__ = ["MinHeap", "LRUCache", "RingBuffer", "SortedList"]
