//! The real AWS backend: aws-sdk-autoscaling, aws-sdk-ec2 and aws-sdk-eks.
