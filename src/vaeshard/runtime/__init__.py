"""The machinery of a request, with no model knowledge: communication (comm.py, the only module that
calls torch.distributed), the request object, its check and agreement (requests.py), the tile
executor (tile.py), the spatial shards and their context (spatial.py), layer swapping (swap.py) and
CUDA graphs (graphs.py)."""
