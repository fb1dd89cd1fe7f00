"""A binary min-heap in a list."""


class MinHeap:
    def __init__(self, items=()):
        self._a = list(items)
        for i in range(len(self._a) // 2 - 1, -1, -1):
            self._sift_down(i)

    def __len__(self):
        return len(self._a)

    def push(self, item):
        self._a.append(item)
        self._sift_up(len(self._a) - 1)

    def peek(self):
        if not self._a:
            raise IndexError("peek at an empty heap")
        return self._a[0]

    def pop(self):
        if not self._a:
            raise IndexError("pop from an empty heap")
        last = self._a.pop()
        if not self._a:
            return last
        top = self._a[0]
        self._a[0] = last
        self._sift_down(0)
        return top

    def _sift_up(self, i):
        a = self._a
        while i > 0:
            parent = (i - 1) // 2
            if a[i] < a[parent]:
                a[i], a[parent] = a[parent], a[i]
                i = parent
            else:
                break

    def _sift_down(self, i):
        a = self._a
        n = len(a)
        while True:
            smallest = i
            left = 2 * i + 1
            right = left + 1
            if left < n and a[left] < a[smallest]:
                smallest = left
            if right < n and a[right] < a[smallest]:
                smallest = right
            if smallest == i:
                return
            a[i], a[smallest] = a[smallest], a[i]
            i = smallest

    def drain(self):
        """All items, smallest first (empties the heap)."""
        return [self.pop() for _ in range(len(self._a))]
