"""TensorBoard's event.proto and the files it imports, as a FileDescriptorSet taken from the
tensorboard wheel (which ships the compiled descriptors, not the .proto sources): protoc generates
kdflow's C++ event writer's messages from it (`protoc --descriptor_set_in`), as onnx.proto is
compiled from the onnx wheel. Run with the venv's python (src/app/CMakeLists.txt does).
Usage: tensorboard_protos.py OUT.pb  (prints the .proto names it holds, dependencies first)"""
import sys

from google.protobuf import descriptor_pb2
from tensorboard.compat.proto import event_pb2


def main():
    ordered = []

    def walk(fd):
        for dep in fd.dependencies:
            walk(dep)
        if fd.name not in [f.name for f in ordered]:
            ordered.append(fd)

    walk(event_pb2.DESCRIPTOR)
    out = descriptor_pb2.FileDescriptorSet()
    for fd in ordered:
        fd.CopyToProto(out.file.add())
    with open(sys.argv[1], "wb") as f:
        f.write(out.SerializeToString())
    print(";".join(fd.name for fd in ordered))


if __name__ == "__main__":
    main()
