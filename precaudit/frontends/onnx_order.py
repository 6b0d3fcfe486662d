"""The order onnxruntime runs an ONNX graph in, where the file's order lets a body read an outer value a later node
makes (onnxruntime's float16 converter writes such models): a node after every node making what it or its bodies
read."""

from __future__ import annotations

import heapq

import onnx

__all__ = ["sort_for_bodies"]


def sort_for_bodies(gp: onnx.GraphProto) -> None:
    """Order each graph's nodes (bodies first) so that a node follows every node making a value it or its bodies
    read, keeping the file's order otherwise; a graph with a cycle is left as it is."""
    def bodies(node: onnx.NodeProto) -> list[onnx.GraphProto]:
        return [g for a in node.attribute for g in ([a.g] if a.HasField("g") else list(a.graphs))]

    def reads(node: onnx.NodeProto) -> set[str]:
        names, todo = set(node.input), bodies(node)
        while todo:
            body = todo.pop()
            for inner in body.node:
                names.update(inner.input)
                todo += bodies(inner)
        return names

    for node in gp.node:
        for body in bodies(node):
            sort_for_bodies(body)
    nodes = list(gp.node)
    maker = {o: i for i, n in enumerate(nodes) for o in n.output if o}
    waiting = [0] * len(nodes)
    readers: list[list[int]] = [[] for _ in nodes]
    for i, n in enumerate(nodes):
        for j in {maker[x] for x in reads(n) if x in maker and maker[x] != i}:
            waiting[i] += 1
            readers[j].append(i)
    ready = [i for i, w in enumerate(waiting) if not w]
    heapq.heapify(ready)  # the earliest ready node first: the file's order wherever it is a valid one
    order: list[int] = []
    while ready:
        i = heapq.heappop(ready)
        order.append(i)
        for k in readers[i]:
            waiting[k] -= 1
            if not waiting[k]:
                heapq.heappush(ready, k)
    if len(order) == len(nodes) and order != list(range(len(nodes))):  # (a cycle is left for the builder to name)
        del gp.node[:]
        gp.node.extend(nodes[i] for i in order)
