// Stub of Apple's Metal framework for the Objective-C++ syntax check of csrc/mps on Linux (see
// Foundation/Foundation.h): the protocols, classes and methods the host and torch's MPS headers
// use, with the SDK's signatures (macOS 15 SDK; mathMode and mathFloatingPointFunctions are new
// in it).
#pragma once

#import <Foundation/Foundation.h>

typedef struct {
  NSUInteger width, height, depth;
} MTLSize;

static inline MTLSize MTLSizeMake(NSUInteger width, NSUInteger height, NSUInteger depth) {
  MTLSize size = {width, height, depth};
  return size;
}

typedef NS_OPTIONS(NSUInteger, MTLResourceOptions) {
  MTLResourceStorageModeShared = 0,
  MTLResourceStorageModePrivate = 1 << 4,
};

typedef NS_ENUM(NSUInteger, MTLLanguageVersion) {
  MTLLanguageVersion3_0 = (3 << 16) + 0,
  MTLLanguageVersion3_1 = (3 << 16) + 1,
  MTLLanguageVersion3_2 = (3 << 16) + 2,
};

typedef NS_ENUM(NSInteger, MTLMathMode) {
  MTLMathModeSafe = 0,
  MTLMathModeRelaxed = 1,
  MTLMathModeFast = 2,
};

typedef NS_ENUM(NSInteger, MTLMathFloatingPointFunctions) {
  MTLMathFloatingPointFunctionsFast = 0,
  MTLMathFloatingPointFunctionsPrecise = 1,
};

@protocol MTLDevice;
@protocol MTLCommandBuffer;

@protocol MTLResource <NSObject>
@property(readonly) id<MTLDevice> device;
@property(copy) NSString* label;
@end

@protocol MTLBuffer <MTLResource>
@property(readonly) NSUInteger length;
- (void*)contents;
@end

@protocol MTLFunction <NSObject>
@property(readonly) NSString* name;
@end

@protocol MTLLibrary <NSObject>
- (id<MTLFunction>)newFunctionWithName:(NSString*)functionName;
@end

@protocol MTLComputePipelineState <NSObject>
@property(readonly) NSUInteger maxTotalThreadsPerThreadgroup;
@property(readonly) NSUInteger threadExecutionWidth;
@property(readonly) NSUInteger staticThreadgroupMemoryLength;
@end

@protocol MTLCommandEncoder <NSObject>
@property(copy) NSString* label;
- (void)endEncoding;
- (void)pushDebugGroup:(NSString*)string;
- (void)popDebugGroup;
@end

@protocol MTLComputeCommandEncoder <MTLCommandEncoder>
- (void)setComputePipelineState:(id<MTLComputePipelineState>)state;
- (void)setBuffer:(id<MTLBuffer>)buffer offset:(NSUInteger)offset atIndex:(NSUInteger)index;
- (void)setBytes:(const void*)bytes length:(NSUInteger)length atIndex:(NSUInteger)index;
- (void)setThreadgroupMemoryLength:(NSUInteger)length atIndex:(NSUInteger)index;
- (void)dispatchThreadgroups:(MTLSize)threadgroupsPerGrid
       threadsPerThreadgroup:(MTLSize)threadsPerThreadgroup;
- (void)dispatchThreads:(MTLSize)threadsPerGrid
    threadsPerThreadgroup:(MTLSize)threadsPerThreadgroup;
@end

typedef void (^MTLCommandBufferHandler)(id<MTLCommandBuffer>);

@protocol MTLCommandBuffer <NSObject>
- (id<MTLComputeCommandEncoder>)computeCommandEncoder;
- (void)commit;
- (void)waitUntilCompleted;
- (void)addCompletedHandler:(MTLCommandBufferHandler)block;
@end

@protocol MTLCommandQueue <NSObject>
- (id<MTLCommandBuffer>)commandBuffer;
@end

@protocol MTLEvent <NSObject>
@end

@protocol MTLSharedEvent <MTLEvent>
@property uint64_t signaledValue;
@end

@interface MTLCompileOptions : NSObject <NSCopying>
@property(readwrite, nonatomic) BOOL fastMathEnabled;
@property(readwrite, nonatomic) MTLMathMode mathMode;
@property(readwrite, nonatomic) MTLMathFloatingPointFunctions mathFloatingPointFunctions;
@property(readwrite, nonatomic) MTLLanguageVersion languageVersion;
@end

@protocol MTLDevice <NSObject>
@property(readonly) NSString* name;
@property(readonly) NSUInteger maxThreadgroupMemoryLength;
- (id<MTLCommandQueue>)newCommandQueue;
- (id<MTLBuffer>)newBufferWithLength:(NSUInteger)length options:(MTLResourceOptions)options;
- (id<MTLLibrary>)newLibraryWithSource:(NSString*)source
                               options:(MTLCompileOptions*)options
                                 error:(NSError**)error;
- (id<MTLComputePipelineState>)newComputePipelineStateWithFunction:(id<MTLFunction>)computeFunction
                                                             error:(NSError**)error;
@end
